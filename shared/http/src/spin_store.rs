//! The domain's storage traits over Spin's SQLite and key-value interfaces.

use std::cell::RefCell;

use reservations_store::{KeyValue, Sql, SqlRows, SqlValue, StorageError};
use spin_sdk::{key_value, sqlite};

/// Spin's `default` SQLite database. On libSQL a connection is one server-side session;
/// once the server has expired it, every later statement on it fails, so the next statement
/// goes to a new connection (the store runs the interrupted transaction again).
pub struct SpinDb(RefCell<sqlite::Connection>);

impl SpinDb {
    pub fn open_default() -> Result<SpinDb, StorageError> {
        open_connection().map(|connection| SpinDb(RefCell::new(connection)))
    }
}

fn open_connection() -> Result<sqlite::Connection, StorageError> {
    sqlite::Connection::open_default().map_err(|e| {
        StorageError::from_sqlite_message(format!("opening the default database: {e}"))
    })
}

/// Whether an error says the connection's server-side session is gone.
fn is_session_lost(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "stream_expired",
        "stream has expired",
        "stream handle",
        "baton",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

fn to_spin(value: &SqlValue) -> sqlite::Value {
    match value {
        SqlValue::Integer(n) => sqlite::Value::Integer(*n),
        SqlValue::Real(r) => sqlite::Value::Real(*r),
        SqlValue::Text(s) => sqlite::Value::Text(s.clone()),
        SqlValue::Blob(b) => sqlite::Value::Blob(b.clone()),
        SqlValue::Null => sqlite::Value::Null,
    }
}

fn from_spin(value: sqlite::Value) -> SqlValue {
    match value {
        sqlite::Value::Integer(n) => SqlValue::Integer(n),
        sqlite::Value::Real(r) => SqlValue::Real(r),
        sqlite::Value::Text(s) => SqlValue::Text(s),
        sqlite::Value::Blob(b) => SqlValue::Blob(b),
        sqlite::Value::Null => SqlValue::Null,
    }
}

fn sqlite_error(e: sqlite::Error) -> StorageError {
    match e {
        sqlite::Error::Io(message) => StorageError::from_sqlite_message(message),
        other => StorageError::Other(other.to_string()),
    }
}

impl Sql for SpinDb {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let params: Vec<sqlite::Value> = params.iter().map(to_spin).collect();
        let result = self.0.borrow().execute(statement, &params);
        let result = result.map_err(|e| {
            let error = sqlite_error(e);
            if is_session_lost(&error.to_string())
                && let Ok(fresh) = open_connection()
            {
                *self.0.borrow_mut() = fresh;
            }
            error
        })?;
        Ok(SqlRows {
            columns: result.columns,
            rows: result
                .rows
                .into_iter()
                .map(|row| row.values.into_iter().map(from_spin).collect())
                .collect(),
        })
    }
}

/// Spin's `default` key-value store.
pub struct SpinKv(key_value::Store);

impl SpinKv {
    pub fn open_default() -> Result<SpinKv, StorageError> {
        key_value::Store::open_default()
            .map(SpinKv)
            .map_err(|e| StorageError::Other(format!("opening the default key-value store: {e}")))
    }
}

fn kv_error(e: key_value::Error) -> StorageError {
    match StorageError::from_sqlite_message(format!("key-value: {e}")) {
        transient @ (StorageError::Busy(_) | StorageError::Unavailable(_)) => transient,
        other => StorageError::Other(other.to_string()),
    }
}

/// How often a key-value operation is tried while the store reports itself locked.
const KV_ATTEMPTS: u32 = 8;

/// Spin's local store is an SQLite file in rollback-journal mode shared by every instance
/// (and by every replica on the same state): a write can meet `database is locked` without
/// waiting when two connections would otherwise deadlock. Such an operation is tried again
/// a bounded number of times, with a short growing back-off; other errors are final.
fn with_retry<T>(
    mut operation: impl FnMut() -> Result<T, key_value::Error>,
) -> Result<T, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match operation().map_err(kv_error) {
            Err(StorageError::Busy(_)) if attempt < KV_ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(2u64 << attempt));
            }
            other => return other,
        }
    }
}

impl KeyValue for SpinKv {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        with_retry(|| self.0.get(key))
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        with_retry(|| self.0.set(key, value))
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        with_retry(|| self.0.delete(key))
    }
}
