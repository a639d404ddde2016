//! The app's settings, read from its Spin variables.

use reservations_store::cells::Cells;

use crate::forward::HomeApp;
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
    /// How many of one token's events-feed requests may run at once, counted in the
    /// key-value store before any statement; 0: not counted there (docs/design.md, "The
    /// events feed").
    pub(crate) feed_requests_per_token: i64,
    /// How many cells the market is partitioned over (docs/design.md, "Cells"): the labels
    /// `default`, `cell1` … `cell<n-1>`, which the component must be granted.
    pub cells: Cells,
    /// Where writes run when this app is not beside the primaries: the app there, from
    /// `home_url` (docs/design.md, "Writes at home"); `None`: this app is home.
    pub(crate) home: Option<HomeApp>,
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
            org_write_share: count_variable("org_write_share"),
            feed_requests_per_token: count_variable("feed_requests_per_token"),
            cells: cells_variable()?,
            home: home_variable()?,
        })
    }
}

impl AppConfig {
    /// The name under which what the store finds of the database `label` (whether it is a
    /// replica) is remembered in the key-value store: an app at a site and its home may share
    /// one store, and their databases of one label are not alike.
    pub(crate) fn remembered_as(&self, label: &str) -> String {
        match self.home {
            Some(_) => format!("{label}.at-a-site"),
            None => label.to_owned(),
        }
    }
}

/// The `cells` variable: one when unset; anything but a whole number from 1 to
/// [`Cells::MAX`] is a deployment that cannot be served right (503, as an unset secret).
fn cells_variable() -> Result<Cells, Problem> {
    let Ok(value) = spin_sdk::variables::get("cells") else {
        return Ok(Cells::ONE);
    };
    value
        .trim()
        .parse()
        .ok()
        .and_then(Cells::new)
        .ok_or_else(|| {
            Problem::new(
                503,
                "cells-misconfigured",
                "Service not configured",
                format!(
                    "the cells variable is {value:?}; it must be a whole number from 1 to {} (SPIN_VARIABLE_CELLS)",
                    Cells::MAX
                ),
            )
        })
}

/// The `home_url` variable: unset or empty, this app is home; anything but an `http://` or
/// `https://` origin is a deployment that cannot be served right (503, as an unset secret).
fn home_variable() -> Result<Option<HomeApp>, Problem> {
    let value = spin_sdk::variables::get("home_url").unwrap_or_default();
    HomeApp::parse(&value).map_err(|reason| {
        Problem::new(
            503,
            "home-url-misconfigured",
            "Service not configured",
            format!("the home_url variable: {reason} (SPIN_VARIABLE_HOME_URL)"),
        )
    })
}

/// A variable that holds a count: 0 when unset or not a whole number from 0 up.
fn count_variable(name: &str) -> i64 {
    spin_sdk::variables::get(name)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .filter(|count: &i64| *count >= 0)
        .unwrap_or(0)
}
