//! What health says of each cell beside the directory (docs/design.md, "Cells").
//!
//! Health never asks a cell's database once it has migrated it: a stalled server would hold
//! the health check for as long as a statement waits (10 s), and every replica's readiness
//! with it, while only that cell's nodes are out. So the requests tell it instead: a request
//! whose statements found a cell's database out of reach, or took no answer from it, writes
//! the time into the key-value store, and health reports that cell `unavailable` for
//! [`LOST_FOR_MS`] after the last such request. Nothing is written while a cell answers.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use reservations_store::KeyValue;
use reservations_store::schema::{LATEST_VERSION, migrate};

use crate::config::AppConfig;
use crate::config::{SpinDb, SpinKv};

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

/// Each cell beside the directory, by its label, with whether it answers: up to date with
/// this build's schema, and not lost by a request lately.
pub fn cells_answering(config: &AppConfig, kv: &SpinKv) -> BTreeMap<String, bool> {
    config
        .cells
        .all()
        .skip(1)
        .map(|cell| {
            let label = cell.label();
            let answering = !lost_lately(kv, &label, Utc::now()) && cell_up_to_date(kv, &label);
            (label, answering)
        })
        .collect()
}

/// Whether the cell labelled `label` has this build's schema: migrated now, or by an earlier
/// health check, as the key-value store remembers. A cell once migrated is not asked again,
/// so a cell whose server stalls or is down costs health nothing: the replicas stay ready and
/// every other cell's nodes are served; the requests that lose it say so
/// (see the module's comment).
fn cell_up_to_date(kv: &SpinKv, label: &str) -> bool {
    let memory = format!("healthz/cells/{label}/schema-version");
    let latest = LATEST_VERSION.to_string();
    if kv.get(&memory).ok().flatten().as_deref() == Some(latest.as_bytes()) {
        return true;
    }
    let migrated = migrate(&SpinDb::open(label)).is_ok();
    if migrated {
        // Remembered or not, the cell is up to date; a health check that could not write
        // the memory migrates it again next time.
        let _ = kv.set(&memory, latest.as_bytes());
    }
    migrated
}
