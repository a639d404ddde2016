//! Times relative to the real clock.

use spin_host::TimeDelta;

/// An RFC 3339 time `seconds` from the real now.
pub fn rfc3339_from_now(seconds: i64) -> String {
    (chrono::Utc::now() + TimeDelta::seconds(seconds))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
