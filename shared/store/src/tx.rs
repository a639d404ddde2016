//! Short write transactions: `BEGIN IMMEDIATE … COMMIT`, retried a bounded number of times
//! when another writer holds the lock, rolled back on any error so nothing is half-written.

use std::time::Duration;

use reservations_domain::storage::{Sql, StorageError};

use crate::{Result, StoreError};

const ATTEMPTS: u32 = 12;

fn is_busy(e: &StoreError) -> bool {
    matches!(e, StoreError::Storage(StorageError::Busy(_)))
}

/// Runs `work` inside one immediate transaction; retries the whole transaction while the
/// database is busy, with a short growing back-off, at most [`ATTEMPTS`] times.
pub(crate) fn in_write_transaction<T>(
    db: &dyn Sql,
    mut work: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let outcome = run_once(db, &mut work);
        match outcome {
            Err(e) if is_busy(&e) && attempt < ATTEMPTS => {
                std::thread::sleep(Duration::from_millis(2u64 << attempt.min(7)));
            }
            other => return other,
        }
    }
}

fn run_once<T>(db: &dyn Sql, work: &mut impl FnMut() -> Result<T>) -> Result<T> {
    db.execute("BEGIN IMMEDIATE", &[])?;
    let result = work().and_then(|value| {
        db.execute("COMMIT", &[])?;
        Ok(value)
    });
    if result.is_err() {
        // The transaction may already be gone (e.g. COMMIT failed and SQLite rolled back);
        // a failing ROLLBACK then says nothing new.
        let _ = db.execute("ROLLBACK", &[]);
    }
    result
}
