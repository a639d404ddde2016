//! Instants, as the API writes them (RFC 3339, UTC, milliseconds) and as the store keeps
//! them (milliseconds since the Unix epoch, so that ranges are indexable integers).

use chrono::{DateTime, SecondsFormat, Utc};

pub type Timestamp = DateTime<Utc>;

pub fn to_rfc3339(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parses an RFC 3339 instant with any offset, truncated to the millisecond the store keeps:
/// every rule then sees exactly the instant that will be stored (`…00.0001Z` and `…00.0009Z`
/// are the same instant, not two that the database would find equal after validation passed).
pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let parsed = DateTime::parse_from_rfc3339(s).ok()?;
    DateTime::from_timestamp_millis(parsed.timestamp_millis())
}

pub fn to_millis(t: Timestamp) -> i64 {
    t.timestamp_millis()
}

pub fn from_millis(ms: i64) -> Timestamp {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
}
