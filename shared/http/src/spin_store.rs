//! The domain's storage traits over Spin's SQLite and key-value interfaces.

use std::cell::{Cell, RefCell};

use reservations_store::{Counters, KeyValue, Sql, SqlRows, SqlValue, StorageError, retry};
use spin_sdk::wit::wasi::keyvalue as kv;
use spin_sdk::{key_value, sqlite};

/// One of Spin's SQLite databases, by label (`default`, or a cell's). On libSQL a connection is one server-side session;
/// once the server has expired it, every later statement on it fails, so the next statement
/// goes to a new connection (the store runs the interrupted transaction again).
///
/// A statement the store asks to run on a connection of its own
/// ([`Sql::next_on_a_new_connection`], at an edge site) gets a newly opened one, which
/// replaces the old: dropping that closes its server-side session.
pub struct SpinDb {
    label: String,
    /// Opened at the first statement: a database a request never asks anything is never
    /// opened.
    connection: RefCell<Option<sqlite::Connection>>,
    renew: Cell<bool>,
}

impl SpinDb {
    pub fn open_default() -> SpinDb {
        SpinDb::open(reservations_store::cells::DIRECTORY_LABEL)
    }

    /// The database Spin serves under `label`, opened at its first statement.
    pub fn open(label: &str) -> SpinDb {
        SpinDb {
            label: label.to_owned(),
            connection: RefCell::new(None),
            renew: Cell::new(false),
        }
    }
}

fn open_connection(label: &str) -> Result<sqlite::Connection, StorageError> {
    sqlite::Connection::open(label).map_err(|e| {
        StorageError::from_sqlite_message(format!("opening the database {label}: {e}"))
    })
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
        other => StorageError::Other(other.to_string().into()),
    }
}

impl Sql for SpinDb {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let mut connection = self.connection.borrow_mut();
        if self.renew.replace(false) || connection.is_none() {
            *connection = Some(open_connection(&self.label)?);
        }
        let params: Vec<sqlite::Value> = params.iter().map(to_spin).collect();
        reservations_store::tally::statement_ran();
        let result = connection
            .as_ref()
            .expect("opened just above")
            .execute(statement, &params);
        let result = result.map_err(|e| {
            let error = sqlite_error(e);
            if error.session_lost() {
                *connection = open_connection(&self.label).ok();
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

    fn next_on_a_new_connection(&self) {
        self.renew.set(true);
    }
}

/// Spin's `default` key-value store.
pub struct SpinKv(key_value::Store);

impl SpinKv {
    pub fn open_default() -> Result<SpinKv, StorageError> {
        key_value::Store::open_default().map(SpinKv).map_err(|e| {
            StorageError::Other(format!("opening the default key-value store: {e}").into())
        })
    }
}

fn kv_error(e: key_value::Error) -> StorageError {
    match StorageError::from_sqlite_message(format!("key-value: {e}")) {
        transient @ (StorageError::Busy(_) | StorageError::Unavailable(_)) => transient,
        other => StorageError::Other(other.to_string().into()),
    }
}

/// Spin's local store is an SQLite file in rollback-journal mode shared by every instance
/// (and by every replica on the same state): a write can meet `database is locked` without
/// waiting when two connections would otherwise deadlock. Such an operation is tried again
/// as [`retry`] says; other errors are final.
fn with_retry<T>(
    mut operation: impl FnMut() -> Result<T, key_value::Error>,
) -> Result<T, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match operation().map_err(kv_error) {
            Err(StorageError::Busy(_)) if attempt < retry::KEY_VALUE_LOCKED_ATTEMPTS => {
                std::thread::sleep(retry::key_value_backoff(attempt));
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

/// Spin's `default` key-value store through `wasi:keyvalue`: the counters of each org's share
/// of the writes (the store's atomic increment), and what the store remembers of its site.
/// Opened at the first use, so a request that needs neither never opens it.
#[derive(Default)]
pub struct DefaultBucket(std::cell::OnceCell<Result<kv::store::Bucket, StorageError>>);

impl DefaultBucket {
    fn bucket(&self) -> Result<&kv::store::Bucket, StorageError> {
        self.0
            .get_or_init(|| kv::store::open("default").map_err(counter_error))
            .as_ref()
            .map_err(Clone::clone)
    }
}

fn counter_error(e: kv::store::Error) -> StorageError {
    StorageError::Other(format!("wasi:keyvalue: {e:?}").into())
}

/// A counter as the store keeps it: Spin's Redis store as decimal text (`INCRBY`), its local
/// store as 8 little-endian bytes. (Eight bytes that are all decimal digits would be a count
/// above 3 · 10^18, never one of these.)
fn counter_value(bytes: &[u8]) -> Option<i64> {
    if let Ok(text) = std::str::from_utf8(bytes)
        && let Ok(value) = text.parse::<i64>()
    {
        return Some(value);
    }
    <[u8; 8]>::try_from(bytes).ok().map(i64::from_le_bytes)
}

impl KeyValue for DefaultBucket {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.bucket()?.get(key).map_err(counter_error)
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        self.bucket()?.set(key, value).map_err(counter_error)
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.bucket()?.delete(key).map_err(counter_error)
    }
}

impl Counters for DefaultBucket {
    fn add(&self, key: &str, delta: i64) -> Result<i64, StorageError> {
        kv::atomics::increment(self.bucket()?, key, delta).map_err(counter_error)
    }

    fn read(&self, key: &str) -> Result<i64, StorageError> {
        match self.bucket()?.get(key).map_err(counter_error)? {
            None => Ok(0),
            Some(bytes) => counter_value(&bytes)
                .ok_or_else(|| StorageError::Other(format!("{key} is not a counter").into())),
        }
    }

    fn remove(&self, key: &str) -> Result<(), StorageError> {
        self.bucket()?.delete(key).map_err(counter_error)
    }
}

#[cfg(test)]
mod tests {
    use super::counter_value;

    #[test]
    fn a_counter_reads_as_either_store_keeps_it() {
        assert_eq!(counter_value(b"8"), Some(8));
        assert_eq!(counter_value(b"-1"), Some(-1));
        assert_eq!(counter_value(&8i64.to_le_bytes()), Some(8));
        assert_eq!(counter_value(&(-1i64).to_le_bytes()), Some(-1));
        assert_eq!(counter_value(b"gpu"), None);
    }
}
