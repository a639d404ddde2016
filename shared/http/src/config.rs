//! The app's settings, read from its Spin variables.

use crate::problem::Problem;

/// How long a request body may take to arrive unless `body_deadline_ms` says otherwise.
pub const DEFAULT_BODY_DEADLINE_MS: u64 = 10_000;

/// The app's settings, from its variables.
pub struct AppConfig {
    pub(crate) operator_token: String,
    /// Keys the audit chain's hashes.
    pub(crate) audit_key: String,
    /// How long a request body may take to arrive.
    pub(crate) body_deadline_ms: u64,
    /// How many of one org's write statements may run at once; 0: no shares
    /// (docs/design.md, "One org's share of the writes").
    pub(crate) org_write_share: i64,
}

impl AppConfig {
    /// The settings, or the 503 problem every authenticated route (and health) answers
    /// while a secret the app needs is empty.
    pub fn read() -> Result<AppConfig, Problem> {
        let unset = |variable: &str, code: &'static str| {
            Problem::new(
                503,
                code,
                "Service not configured",
                format!(
                    "the {variable} variable is not set (SPIN_VARIABLE_{}); authenticated routes are refused until it is",
                    variable.to_ascii_uppercase()
                ),
            )
        };
        let secret = |variable: &str, code| match spin_sdk::variables::get(variable) {
            Ok(value) if !value.trim().is_empty() => Ok(value),
            _ => Err(unset(variable, code)),
        };
        Ok(AppConfig {
            operator_token: secret("operator_token", "operator-token-unset")?,
            audit_key: secret("audit_key", "audit-key-unset")?,
            body_deadline_ms: spin_sdk::variables::get("body_deadline_ms")
                .ok()
                .and_then(|value| value.parse().ok())
                .unwrap_or(DEFAULT_BODY_DEADLINE_MS),
            org_write_share: spin_sdk::variables::get("org_write_share")
                .ok()
                .and_then(|value| value.trim().parse().ok())
                .filter(|share: &i64| *share >= 0)
                .unwrap_or(0),
        })
    }
}
