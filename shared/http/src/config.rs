//! The app's settings, read from its Spin variables, and the stores Spin opens for it: the
//! store's `Sql`, `KeyValue` and `Counters` over Spin's SQLite and key-value interfaces.

use crate::forward::HomeApp;
use crate::problem::Problem;
use reservations_store::cells::Cells;
use reservations_store::{Counters, KeyValue, Sql, SqlRows, SqlValue, StorageError, storage};
use spin_sdk::wit::wasi::keyvalue as kv;
use spin_sdk::{key_value, sqlite};
use std::cell::{Cell, RefCell};

/// How long a request body may take to arrive unless `body_deadline_ms` says otherwise.
pub const DEFAULT_BODY_DEADLINE_MS: u64 = 10_000;

/// The app's settings, from its variables.
pub struct AppConfig {
    pub(crate) operator_token: String,
    /// Keys the audit chain's hashes.
    pub(crate) audit_key: String,
    /// How long a request body may take to arrive.
    pub(crate) body_deadline_ms: u64,
    /// How many of one org's write statements may run at once; 0: no shares
    /// (docs/design.md, "One org's share of the writes").
    pub(crate) org_write_share: i64,
    /// How many of one token's events-feed requests may run at once, counted in the
    /// key-value store before any statement; 0: not counted there (docs/design.md, "The
    /// events feed").
    pub(crate) feed_requests_per_token: i64,
    /// How many cells the market is partitioned over (docs/design.md, "Cells"): the labels
    /// `default`, `cell1` … `cell<n-1>`, which the component must be granted.
    pub cells: Cells,
    /// Where writes run when this app is not beside the primaries: the app there, from
    /// `home_url` (docs/design.md, "Writes at home"); `None`: this app is home.
    pub(crate) home: Option<HomeApp>,
}

impl AppConfig {
    /// The settings, or the 503 problem every authenticated route (and health) answers
    /// while a secret the app needs is empty.
    pub fn read() -> Result<AppConfig, Problem> {
        let unset = |variable: &str, code: &'static str| {
            Problem::new(
                503,
                code,
                "Service not configured",
                format!(
                    "the {variable} variable is not set (SPIN_VARIABLE_{}); authenticated routes are refused until it is",
                    variable.to_ascii_uppercase()
                ),
            )
        };
        let secret = |variable: &str, code| match spin_sdk::variables::get(variable) {
            Ok(value) if !value.trim().is_empty() => Ok(value),
            _ => Err(unset(variable, code)),
        };
        Ok(AppConfig {
            operator_token: secret("operator_token", "operator-token-unset")?,
            audit_key: secret("audit_key", "audit-key-unset")?,
            body_deadline_ms: spin_sdk::variables::get("body_deadline_ms")
                .ok()
                .and_then(|value| value.parse().ok())
                .unwrap_or(DEFAULT_BODY_DEADLINE_MS),
            org_write_share: count_variable("org_write_share"),
            feed_requests_per_token: count_variable("feed_requests_per_token"),
            cells: cells_variable()?,
            home: home_variable()?,
        })
    }
}

impl AppConfig {
    /// The name under which what the store finds of the database `label` (whether it is a
    /// replica) is remembered in the key-value store: an app at a site and its home may share
    /// one store, and their databases of one label are not alike.
    pub(crate) fn remembered_as(&self, label: &str) -> String {
        match self.home {
            Some(_) => format!("{label}.at-a-site"),
            None => label.to_owned(),
        }
    }
}

/// The `cells` variable: one when unset; anything but a whole number from 1 to
/// [`Cells::MAX`] is a deployment that cannot be served right (503, as an unset secret).
fn cells_variable() -> Result<Cells, Problem> {
    let Ok(value) = spin_sdk::variables::get("cells") else {
        return Ok(Cells::ONE);
    };
    value
        .trim()
        .parse()
        .ok()
        .and_then(Cells::new)
        .ok_or_else(|| {
            Problem::new(
                503,
                "cells-misconfigured",
                "Service not configured",
                format!(
                    "the cells variable is {value:?}; it must be a whole number from 1 to {} (SPIN_VARIABLE_CELLS)",
                    Cells::MAX
                ),
            )
        })
}

/// The `home_url` variable: unset or empty, this app is home; anything but an `http://` or
/// `https://` origin is a deployment that cannot be served right (503, as an unset secret).
fn home_variable() -> Result<Option<HomeApp>, Problem> {
    let value = spin_sdk::variables::get("home_url").unwrap_or_default();
    HomeApp::parse(&value).map_err(|reason| {
        Problem::new(
            503,
            "home-url-misconfigured",
            "Service not configured",
            format!("the home_url variable: {reason} (SPIN_VARIABLE_HOME_URL)"),
        )
    })
}

/// A variable that holds a count: 0 when unset or not a whole number from 0 up.
fn count_variable(name: &str) -> i64 {
    spin_sdk::variables::get(name)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .filter(|count: &i64| *count >= 0)
        .unwrap_or(0)
}

// ============================================================================================
// The stores Spin opens
//
// The domain's storage traits over Spin's SQLite and key-value interfaces.

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
        reservations_store::storage::Tally::statement_ran();
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
/// as [`storage`]'s retry policy says; other errors are final.
fn with_retry<T>(
    mut operation: impl FnMut() -> Result<T, key_value::Error>,
) -> Result<T, StorageError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match operation().map_err(kv_error) {
            Err(StorageError::Busy(_)) if attempt < storage::KEY_VALUE_LOCKED_ATTEMPTS => {
                std::thread::sleep(storage::key_value_backoff(attempt));
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
mod spin_store_tests {
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
