//! The storage traits over rusqlite, for tests and benchmarks that run the store natively.

use std::path::Path;

use crate::storage::{KeyValue, Sql, SqlRows, SqlValue, StorageError};
use rusqlite::types::{Value, ValueRef};

fn storage_error(e: rusqlite::Error) -> StorageError {
    StorageError::from_sqlite_message(e.to_string())
}

/// An SQLite database file (or `:memory:`), opened like Spin opens one.
pub struct NativeDb {
    connection: rusqlite::Connection,
}

impl NativeDb {
    pub fn open(path: impl AsRef<Path>) -> Result<NativeDb, StorageError> {
        let connection = rusqlite::Connection::open(path).map_err(storage_error)?;
        Ok(NativeDb { connection })
    }

    pub fn connection(&self) -> &rusqlite::Connection {
        &self.connection
    }
}

fn to_rusqlite(value: &SqlValue) -> Value {
    match value {
        SqlValue::Integer(n) => Value::Integer(*n),
        SqlValue::Real(r) => Value::Real(*r),
        SqlValue::Text(s) => Value::Text(s.clone()),
        SqlValue::Blob(b) => Value::Blob(b.clone()),
        SqlValue::Null => Value::Null,
    }
}

fn from_rusqlite(value: ValueRef<'_>) -> SqlValue {
    match value {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(n) => SqlValue::Integer(n),
        ValueRef::Real(r) => SqlValue::Real(r),
        ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
    }
}

impl Sql for NativeDb {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let mut prepared = self
            .connection
            .prepare_cached(statement)
            .map_err(storage_error)?;
        let columns: Vec<String> = prepared.column_names().map(str::to_owned).collect();
        let width = columns.len();
        let params = rusqlite::params_from_iter(params.iter().map(to_rusqlite));
        let mut cursor = prepared.query(params).map_err(storage_error)?;
        let mut rows = Vec::new();
        while let Some(row) = cursor.next().map_err(storage_error)? {
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                values.push(from_rusqlite(row.get_ref(i).map_err(storage_error)?));
            }
            rows.push(values);
        }
        Ok(SqlRows { columns, rows })
    }
}

/// A key-value store in an SQLite table, like Spin's local default store.
pub struct NativeKv {
    connection: rusqlite::Connection,
}

impl NativeKv {
    pub fn open(path: impl AsRef<Path>) -> Result<NativeKv, StorageError> {
        let connection = rusqlite::Connection::open(path).map_err(storage_error)?;
        connection
            .execute_batch(
                "PRAGMA busy_timeout = 5000;
                 CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL);",
            )
            .map_err(storage_error)?;
        Ok(NativeKv { connection })
    }
}

impl KeyValue for NativeKv {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let mut statement = self
            .connection
            .prepare_cached("SELECT value FROM kv WHERE key = ?")
            .map_err(storage_error)?;
        let mut rows = statement.query([key]).map_err(storage_error)?;
        match rows.next().map_err(storage_error)? {
            Some(row) => Ok(Some(row.get("value").map_err(storage_error)?)),
            None => Ok(None),
        }
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        self.connection
            .prepare_cached("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .and_then(|mut s| s.execute(rusqlite::params![key, value]))
            .map_err(storage_error)?;
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.connection
            .prepare_cached("DELETE FROM kv WHERE key = ?")
            .and_then(|mut s| s.execute([key]))
            .map_err(storage_error)?;
        Ok(())
    }
}
