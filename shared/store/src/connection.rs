//! The store's connection: every statement of the store goes through one [`Connection`],
//! which notices when the schema is behind (a statement fails on a table or column a newer
//! migration adds): it brings the schema up to date and runs the statement again, so no
//! request pays for a version check.
//!
//! It also makes reads never answer busy. In WAL mode a read waits for no writer, yet over
//! libSQL a read can still fail for a moment: sqld refuses a statement past its bound on
//! requests in flight ("Too many concurrent requests"), cancels one on a stream whose earlier
//! cursor it dropped (SQLITE_INTERRUPT), or the stream expired; a local file can be locked
//! while a checkpoint resets the WAL. None of these ran the read, so a read outside an
//! explicit transaction is run again, with the same bounded, jittered back-off as every
//! retry ([`crate::retry`]), rather than answered 503. Writes are not retried here: the write
//! path decides itself whether a failed write may have landed.
//!
//! At an edge site, every statement outside an explicit transaction after the connection's
//! first runs on a connection of its own ([`Sql::next_on_a_new_connection`]), so that sqld's
//! replica runs a read at the site's copy and forwards only writes (docs/design.md, "Edge
//! sites": a replica's connection can be left forwarding everything).

use std::cell::Cell;

use crate::StoreError;
use crate::retry::TransientFailures;
use crate::schema;
use crate::storage::{Sql, SqlRows, SqlValue, StorageError};

/// The database as the store uses it.
pub struct Connection<'a> {
    db: &'a dyn Sql,
    /// What a migration seals the events of earlier builds with.
    audit_key: &'a [u8],
    /// Whether an explicit transaction is open on it: a statement of one is never run again
    /// alone (the connection may have been replaced meanwhile).
    in_transaction: Cell<bool>,
    /// Whether a statement has run on it (its first needs no new connection).
    ran: Cell<bool>,
    /// Whether each statement outside a transaction runs on a new connection (at an edge
    /// site); unknown until the store has asked.
    each_on_its_own: Cell<Option<bool>>,
    /// Whether a statement found the database out of reach or stalled (after its retries).
    lost: Cell<bool>,
}

impl<'a> Connection<'a> {
    pub(crate) fn new(db: &'a dyn Sql, audit_key: &'a [u8]) -> Connection<'a> {
        Connection {
            db,
            audit_key,
            in_transaction: Cell::new(false),
            ran: Cell::new(false),
            each_on_its_own: Cell::new(None),
            lost: Cell::new(false),
        }
    }

    /// Whether a statement found the database out of reach, or took no answer from it.
    pub(crate) fn lost_the_database(&self) -> bool {
        self.lost.get()
    }

    /// The database itself, for a statement whose failure is its answer (a missing table
    /// there is not a schema behind).
    pub(crate) fn unmanaged(&self) -> &'a dyn Sql {
        self.ran.set(true);
        self.db
    }

    /// Whether the store still has to say if each statement runs on its own connection:
    /// only once a statement has run, since the first has a new connection anyway.
    pub(crate) fn needs_placement(&self) -> bool {
        self.ran.get() && self.each_on_its_own.get().is_none()
    }

    /// Every later statement outside an explicit transaction runs on a connection of its
    /// own (`true`: the database is an edge site's replica), or on this one.
    pub(crate) fn set_each_on_its_own(&self, each_on_its_own: bool) {
        self.each_on_its_own.set(Some(each_on_its_own));
    }

    pub fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let kind = StatementKind::of(statement);
        let retried = kind == StatementKind::Read && !self.in_transaction.get();
        let mut failures = TransientFailures::default();
        loop {
            if self.ran.replace(true)
                && !self.in_transaction.get()
                && self.each_on_its_own.get() == Some(true)
            {
                self.db.next_on_a_new_connection();
            }
            let result = self.execute_once(statement, params);
            match kind {
                StatementKind::Begin if result.is_ok() => self.in_transaction.set(true),
                StatementKind::End => self.in_transaction.set(false),
                _ => {}
            }
            match result {
                Err(e) if retried && failures.wait_to_retry(&StoreError::Storage(e.clone())) => {}
                Err(e @ (StorageError::Unavailable(_) | StorageError::Unanswered(_))) => {
                    self.lost.set(true);
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    fn execute_once(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        match self.db.execute(statement, params) {
            Err(StorageError::Behind(..)) => {
                // The statement runs again even when another replica migrated first.
                schema::migrate_keyed(self.db, self.audit_key).map_err(storage_of)?;
                self.db.execute(statement, params)
            }
            other => other,
        }
    }
}

/// What a statement is ([`sql_kind`], as the host also tells), as far as running it again is
/// concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatementKind {
    /// A `SELECT` (or a `WITH` that changes nothing): running it again is always safe.
    Read,
    /// `BEGIN …`: an explicit transaction opens.
    Begin,
    /// `COMMIT`, `END`, `ROLLBACK`: it ends (also when the statement fails).
    End,
    /// Anything else.
    Other,
}

impl StatementKind {
    fn of(statement: &str) -> StatementKind {
        match sql_kind::classify(statement) {
            sql_kind::Kind::Query => StatementKind::Read,
            sql_kind::Kind::BeginDeferred | sql_kind::Kind::BeginWrite => StatementKind::Begin,
            sql_kind::Kind::End => StatementKind::End,
            sql_kind::Kind::ConnectionPragma | sql_kind::Kind::Write | sql_kind::Kind::Other => {
                StatementKind::Other
            }
        }
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
        other => StorageError::Other(other.to_string().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::StatementKind::{self, *};

    #[test]
    fn reads_are_told_from_writes_and_transactions() {
        for (statement, kind) in [
            ("SELECT 1", Read),
            ("  select id FROM keys", Read),
            ("WITH x AS (SELECT 1) SELECT * FROM x", Read),
            ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", Other),
            ("INSERT INTO writes (a) VALUES (1)", Other),
            ("DELETE FROM feed_waits WHERE id = ?", Other),
            ("PRAGMA user_version", Other),
            ("BEGIN IMMEDIATE", Begin),
            ("COMMIT", End),
            ("ROLLBACK", End),
            ("ROLLBACK TO a", Other),
        ] {
            assert_eq!(StatementKind::of(statement), kind, "{statement}");
        }
    }
}
