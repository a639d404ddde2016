//! The store's connection: every statement of the store goes through one [`Connection`],
//! which notices when the schema is behind (a statement fails on a table or column a newer
//! migration adds): it brings the schema up to date and runs the statement again, so no
//! request pays for a version check.

use crate::StoreError;
use crate::schema;
use crate::storage::{Sql, SqlRows, SqlValue, StorageError};

/// The database as the store uses it.
pub struct Connection<'a> {
    db: &'a dyn Sql,
    /// What a migration seals the events of earlier builds with.
    audit_key: &'a [u8],
}

impl<'a> Connection<'a> {
    pub(crate) fn new(db: &'a dyn Sql, audit_key: &'a [u8]) -> Connection<'a> {
        Connection { db, audit_key }
    }

    pub fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        match self.db.execute(statement, params) {
            Err(e) if schema::is_behind(&e) => {
                // The statement runs again even when another replica migrated first.
                schema::migrate_keyed(self.db, self.audit_key).map_err(storage_of)?;
                self.db.execute(statement, params)
            }
            other => other,
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
        other => StorageError::Other(other.to_string()),
    }
}
