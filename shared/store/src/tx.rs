//! The one transaction kind left.
//!
//! Requests hold no transaction: a mutation is one autocommit statement (see
//! [`crate::write`]). What still needs several statements atomically, the migrations, takes
//! an explicit [`Transaction`]: `BEGIN IMMEDIATE`, its statements, `COMMIT`, rolled back when
//! dropped uncommitted, and run again from the start while the database is busy or briefly
//! unreachable ([`crate::storage`]).

use crate::Result;
use crate::storage::retry_transient;
use crate::storage::{Sql, SqlRows, SqlValue, StorageError};

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
