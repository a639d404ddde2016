//! The one transaction kind left, and retries.
//!
//! Requests hold no transaction: a mutation is one autocommit statement (see
//! [`crate::write`]). What still needs several statements atomically, the migrations, takes
//! an explicit [`Transaction`]: `BEGIN IMMEDIATE`, its statements, `COMMIT`, rolled back when
//! dropped uncommitted, and run again from the start, with a jittered back-off, while the
//! database is busy or briefly unreachable.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::storage::{Sql, SqlRows, SqlValue, StorageError};
use crate::{Result, StoreError};

/// How often work is tried while the database is busy.
const BUSY_ATTEMPTS: u32 = 12;
/// How often it is tried while the store cannot be reached: an unreachable store is
/// answered soon (503 with `Retry-After`) rather than waited for.
const UNAVAILABLE_ATTEMPTS: u32 = 3;

/// An immediate write transaction: its statements hold the write lock until it is
/// committed; dropped uncommitted, it is rolled back.
pub struct Transaction<'a> {
    db: &'a dyn Sql,
    open: bool,
}

impl<'a> Transaction<'a> {
    pub fn immediate(db: &'a dyn Sql) -> Result<Transaction<'a>, StorageError> {
        db.execute("BEGIN IMMEDIATE", &[])?;
        Ok(Transaction { db, open: true })
    }

    pub fn commit(mut self) -> Result<(), StorageError> {
        self.open = false;
        let committed = self.db.execute("COMMIT", &[]);
        if committed.is_err() {
            // SQLite may have rolled back already; a failing ROLLBACK then says nothing new.
            let _ = self.db.execute("ROLLBACK", &[]);
        }
        committed.map(|_| ())
    }
}

impl Sql for Transaction<'_> {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        self.db.execute(statement, params)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.db.execute("ROLLBACK", &[]);
        }
    }
}

/// Runs `work` in one immediate transaction, committed if it succeeds, all of it again while
/// it fails transiently.
pub fn in_transaction<T>(
    db: &dyn Sql,
    mut work: impl FnMut(&Transaction<'_>) -> Result<T>,
) -> Result<T> {
    retry_transient(|| {
        let tx = Transaction::immediate(db)?;
        let value = work(&tx)?;
        tx.commit()?;
        Ok(value)
    })
}

/// Whether running the same work again may succeed.
pub(crate) fn is_transient(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Storage(StorageError::Busy(_) | StorageError::Unavailable(_))
    )
}

/// How long to wait before attempt `attempt + 1`: a growing cap (10 ms doubling to 640 ms)
/// and a random point in its upper half, so that writers who collided do not collide again.
pub fn backoff(attempt: u32) -> Duration {
    let cap = 10u64 << attempt.saturating_sub(1).min(6);
    Duration::from_millis(cap / 2 + random_below(cap / 2 + 1))
}

pub(crate) fn random_below(bound: u64) -> u64 {
    // A fresh `RandomState` is seeded from the system's randomness (WASI's on wasm32-wasip2).
    RandomState::new().build_hasher().finish() % bound.max(1)
}

/// Runs `attempt` again while it fails transiently, with [`backoff`], a bounded number of
/// times.
pub(crate) fn retry_transient<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut failures = TransientFailures::default();
    loop {
        match attempt() {
            Err(e) if failures.wait_to_retry(&e) => {}
            other => return other,
        }
    }
}

/// The transient failures of one piece of work so far.
#[derive(Debug, Default)]
pub(crate) struct TransientFailures(u32);

impl TransientFailures {
    /// After the work failed with `e`: whether to try it once more (`e` is transient and the
    /// bound not reached), having waited the [`backoff`] if so.
    pub(crate) fn wait_to_retry(&mut self, e: &StoreError) -> bool {
        if !is_transient(e) {
            return false;
        }
        self.0 += 1;
        let retry = may_retry_transient(e, self.0);
        if retry {
            std::thread::sleep(backoff(self.0));
        }
        retry
    }
}

/// Whether work that failed `attempts` times with `e` may be tried once more.
fn may_retry_transient(e: &StoreError, attempts: u32) -> bool {
    match e {
        StoreError::Storage(StorageError::Busy(_)) => attempts < BUSY_ATTEMPTS,
        StoreError::Storage(StorageError::Unavailable(_)) => attempts < UNAVAILABLE_ATTEMPTS,
        _ => false,
    }
}
