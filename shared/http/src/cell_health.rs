//! What health says of each cell beside the directory (docs/design.md, "Cells").
//!
//! Health never asks a cell's database once it has migrated it: a stalled server would hold
//! the health check for as long as a statement waits (10 s), and every replica's readiness
//! with it, while only that cell's nodes are out. So the requests tell it instead: a request
//! whose statements found a cell's database out of reach, or took no answer from it, writes
//! the time into the key-value store, and health reports that cell `unavailable` for
//! [`LOST_FOR_MS`] after the last such request. Nothing is written while a cell answers.

use chrono::{DateTime, Utc};
use reservations_store::KeyValue;

/// How long after a request last lost a cell's database health reports the cell unavailable.
pub const LOST_FOR_MS: i64 = 30_000;

fn key(label: &str) -> String {
    format!("healthz/cells/{label}/lost-at")
}

/// Remembers that a request lost the database of the cell `label` at `now`. Best effort: a
/// key-value store that fails as well has the request's own answer say it.
pub fn remember_lost(kv: &dyn KeyValue, label: &str, now: DateTime<Utc>) {
    let _ = kv.set(&key(label), now.timestamp_millis().to_string().as_bytes());
}

/// Whether a request lost the database of the cell `label` within [`LOST_FOR_MS`] of `now`.
pub fn lost_lately(kv: &dyn KeyValue, label: &str, now: DateTime<Utc>) -> bool {
    kv.get(&key(label))
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<i64>().ok())
        .is_some_and(|at| now.timestamp_millis() - at < LOST_FOR_MS)
}
