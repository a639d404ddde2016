//! The store's connection and its transactions.
//!
//! Every statement of the store goes through one [`Connection`], which knows whether a
//! transaction is open and whether a request transaction (see [`crate::idempotency`]) holds
//! the write lock — state of the store, not of the thread. It also notices when the schema
//! is behind (a statement fails on a table or column a newer migration adds): it brings the
//! schema up to date and runs the statement again, so no request pays for a version check.
//!
//! Write transactions are `BEGIN IMMEDIATE … COMMIT`, run again from the start, with a
//! jittered back-off, when the database is busy (another writer holds the lock, libSQL took
//! the lock from a transaction that ran too long, the session expired) or briefly
//! unreachable; any error rolls them back, so nothing is half-written. Inside a request
//! transaction the store's writes join it, each as a savepoint, all-or-nothing on its own.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::storage::{Sql, SqlRows, SqlValue, StorageError};

use crate::schema;
use crate::{Result, StoreError};

/// How often a write transaction is tried while the database is busy.
const BUSY_ATTEMPTS: u32 = 12;
/// How often it is tried while the store cannot be reached: an unreachable store is
/// answered soon (503 with `Retry-After`) rather than waited for.
const UNAVAILABLE_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transaction {
    None,
    /// A transaction the store's code opened and will end.
    Open,
    /// A request transaction: `effects` once a write in it has been kept; `lost` once a
    /// statement failed because the database dropped the transaction (it can only be rolled
    /// back and the request run again).
    Request {
        effects: bool,
        lost: bool,
    },
}

/// The database as the store uses it: a connection plus what the store knows about it.
pub struct Connection<'a> {
    db: &'a dyn Sql,
    transaction: Cell<Transaction>,
    /// Migrations were applied inside a transaction, where the journal mode cannot be set:
    /// it is set once that transaction ends.
    wal_pending: Cell<bool>,
}

impl<'a> Connection<'a> {
    pub(crate) fn new(db: &'a dyn Sql) -> Connection<'a> {
        Connection {
            db,
            transaction: Cell::new(Transaction::None),
            wal_pending: Cell::new(false),
        }
    }

    pub fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        if let Transaction::Request { lost: true, .. } = self.transaction.get() {
            return Err(StorageError::Busy(
                "the request transaction was lost; the request must be run again".into(),
            ));
        }
        let result = match self.db.execute(statement, params) {
            Err(e) if schema::is_behind(&e) => {
                // Inside a transaction this connection already holds (or can take) the write
                // lock, so the missing migrations join it; otherwise they take their own. The
                // statement runs again even when another replica migrated first.
                let migrated = if self.transaction.get() == Transaction::None {
                    schema::migrate(self.db)
                } else {
                    let applied = schema::apply_pending(self.db);
                    if matches!(applied, Ok(true)) {
                        self.wal_pending.set(true);
                    }
                    applied
                };
                match migrated {
                    Ok(_) => self.db.execute(statement, params),
                    Err(e) => Err(storage_of(e)),
                }
            }
            other => other,
        };
        self.observe(statement, &result);
        if self.transaction.get() == Transaction::None {
            self.set_wal_if_pending();
        }
        result
    }

    fn set_wal_if_pending(&self) {
        if self.wal_pending.replace(false) {
            schema::use_wal(self.db);
        }
    }

    /// Follows the transactions opened and ended by statements the store's code sends
    /// itself (e.g. a dry run's read transaction).
    fn observe(&self, statement: &str, result: &Result<SqlRows, StorageError>) {
        let keyword = statement
            .trim_start()
            .split(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        match (self.transaction.get(), keyword.as_str(), result) {
            (Transaction::None, "BEGIN", Ok(_)) => self.transaction.set(Transaction::Open),
            (Transaction::Open, "COMMIT" | "END", Ok(_)) => self.transaction.set(Transaction::None),
            (Transaction::Open, "ROLLBACK", _) if !statement.contains(" TO ") => {
                self.transaction.set(Transaction::None)
            }
            (
                Transaction::Request { effects, .. },
                _,
                Err(StorageError::Busy(_) | StorageError::Unavailable(_)),
            ) => self.transaction.set(Transaction::Request {
                effects,
                lost: true,
            }),
            _ => {}
        }
    }

    pub(crate) fn in_request_transaction(&self) -> bool {
        matches!(self.transaction.get(), Transaction::Request { .. })
    }

    /// Takes the write lock for a whole request; the store's writes join it until
    /// [`Connection::end_request`].
    pub(crate) fn begin_request(&self) -> Result<()> {
        retry_transient(|| {
            self.db.execute("BEGIN IMMEDIATE", &[])?;
            Ok(())
        })?;
        self.transaction.set(Transaction::Request {
            effects: false,
            lost: false,
        });
        Ok(())
    }

    /// Whether the request transaction kept any write, and whether it was lost.
    pub(crate) fn request_state(&self) -> (bool, bool) {
        match self.transaction.get() {
            Transaction::Request { effects, lost } => (effects, lost),
            _ => (false, false),
        }
    }

    /// Commits or rolls back the request transaction. A failed commit is rolled back.
    pub(crate) fn end_request(&self, commit: bool) -> Result<()> {
        let lost = self.request_state().1;
        self.transaction.set(Transaction::None);
        if commit && !lost {
            if let Err(e) = self.db.execute("COMMIT", &[]) {
                let _ = self.db.execute("ROLLBACK", &[]);
                return Err(e.into());
            }
            self.set_wal_if_pending();
            return Ok(());
        }
        // After a lost transaction there may be nothing to roll back; that says nothing new.
        let rolled_back = self.db.execute("ROLLBACK", &[]);
        if commit {
            return Err(StorageError::Busy("the request transaction was lost".into()).into());
        }
        if !lost {
            rolled_back?;
        }
        Ok(())
    }
}

impl Sql for Connection<'_> {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        Connection::execute(self, statement, params)
    }
}

fn storage_of(e: StoreError) -> StorageError {
    match e {
        StoreError::Storage(e) => e,
        StoreError::Domain(e) => StorageError::Other(e.to_string()),
    }
}

/// Whether running the same transaction again may succeed.
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

fn random_below(bound: u64) -> u64 {
    // A fresh `RandomState` is seeded from the system's randomness (WASI's on wasm32-wasip2).
    RandomState::new().build_hasher().finish() % bound.max(1)
}

/// Runs `attempt` again while it fails transiently, with [`backoff`], a bounded number of
/// times.
pub(crate) fn retry_transient<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt() {
            Err(e) if may_retry(&e, attempts) => std::thread::sleep(backoff(attempts)),
            other => return other,
        }
    }
}

fn may_retry(e: &StoreError, attempts: u32) -> bool {
    match e {
        StoreError::Storage(StorageError::Busy(_)) => attempts < BUSY_ATTEMPTS,
        StoreError::Storage(StorageError::Unavailable(_)) => attempts < UNAVAILABLE_ATTEMPTS,
        _ => false,
    }
}

/// Runs `work` inside one immediate transaction, all of it again while that fails
/// transiently. Inside a request transaction, `work` runs in a savepoint of it instead.
pub(crate) fn in_write_transaction<T>(
    db: &Connection<'_>,
    mut work: impl FnMut() -> Result<T>,
) -> Result<T> {
    if db.in_request_transaction() {
        return in_savepoint(db, work);
    }
    retry_transient(|| run_once(db, &mut work))
}

fn run_once<T>(db: &Connection<'_>, work: &mut impl FnMut() -> Result<T>) -> Result<T> {
    db.execute("BEGIN IMMEDIATE", &[])?;
    let result = work().and_then(|value| {
        db.execute("COMMIT", &[])?;
        Ok(value)
    });
    if result.is_err() {
        // The transaction may already be gone (e.g. COMMIT failed and SQLite rolled back, or
        // libSQL dropped it); a failing ROLLBACK then says nothing new.
        let _ = db.execute("ROLLBACK", &[]);
    }
    result
}

fn in_savepoint<T>(db: &Connection<'_>, mut work: impl FnMut() -> Result<T>) -> Result<T> {
    db.execute("SAVEPOINT store_write", &[])?;
    let result = work();
    if result.is_err() {
        let _ = db.execute("ROLLBACK TO store_write", &[]);
    }
    db.execute("RELEASE store_write", &[])?;
    if result.is_ok()
        && let Transaction::Request { lost, .. } = db.transaction.get()
    {
        db.transaction.set(Transaction::Request {
            effects: true,
            lost,
        });
    }
    result
}
