//! Short write transactions: `BEGIN IMMEDIATE … COMMIT`, retried a bounded number of times
//! when another writer holds the lock, rolled back on any error so nothing is half-written.
//!
//! A request whose response is recorded for idempotency runs inside one request transaction
//! (see [`crate::idempotency::RequestTransaction`]); the store's writes made meanwhile join
//! it, each as a savepoint, so each is still all-or-nothing on its own.

use std::cell::Cell;
use std::time::Duration;

use crate::storage::{Sql, StorageError};

use crate::{Result, StoreError};

const ATTEMPTS: u32 = 12;

thread_local! {
    /// Whether this thread's connection is inside a request transaction.
    static IN_REQUEST_TRANSACTION: Cell<bool> = const { Cell::new(false) };
}

fn is_busy(e: &StoreError) -> bool {
    matches!(e, StoreError::Storage(StorageError::Busy(_)))
}

/// Runs `attempt` again while the database is busy, with a short growing back-off, at most
/// [`ATTEMPTS`] times.
fn retry_while_busy<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt() {
            Err(e) if is_busy(&e) && attempts < ATTEMPTS => {
                std::thread::sleep(Duration::from_millis(2u64 << attempts.min(7)));
            }
            other => return other,
        }
    }
}

/// Runs `work` inside one immediate transaction; retries the whole transaction while the
/// database is busy. Inside a request transaction, `work` runs in a savepoint of it instead.
pub(crate) fn in_write_transaction<T>(
    db: &dyn Sql,
    mut work: impl FnMut() -> Result<T>,
) -> Result<T> {
    if IN_REQUEST_TRANSACTION.get() {
        return in_savepoint(db, work);
    }
    retry_while_busy(|| run_once(db, &mut work))
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

fn in_savepoint<T>(db: &dyn Sql, mut work: impl FnMut() -> Result<T>) -> Result<T> {
    db.execute("SAVEPOINT store_write", &[])?;
    let result = work();
    if result.is_err() {
        let _ = db.execute("ROLLBACK TO store_write", &[]);
    }
    db.execute("RELEASE store_write", &[])?;
    result
}

/// Takes the write lock for a whole request (waiting, then retrying, while another writer
/// holds it); the store's writes join this transaction until [`end_request_transaction`].
pub(crate) fn begin_request_transaction(db: &dyn Sql) -> Result<()> {
    retry_while_busy(|| Ok(db.execute("BEGIN IMMEDIATE", &[])?))?;
    IN_REQUEST_TRANSACTION.set(true);
    Ok(())
}

/// Commits or rolls back the request transaction. A failed commit is rolled back.
pub(crate) fn end_request_transaction(db: &dyn Sql, commit: bool) -> Result<()> {
    IN_REQUEST_TRANSACTION.set(false);
    if commit {
        if let Err(e) = db.execute("COMMIT", &[]) {
            let _ = db.execute("ROLLBACK", &[]);
            return Err(e.into());
        }
        Ok(())
    } else {
        db.execute("ROLLBACK", &[])?;
        Ok(())
    }
}
