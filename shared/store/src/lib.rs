//! The system of record: every read and write of the reservations service, as SQL over the
//! [`Sql`] and [`KeyValue`] traits, asking `reservations-domain` for every decision.
//!
//! The components run this crate over Spin's SQLite and key-value interfaces; tests and
//! benchmarks run the very same code natively over rusqlite (feature `native`). Every
//! mutation is one short `BEGIN IMMEDIATE` transaction that also appends its audit event,
//! and every operation touches only the rows it needs (O(units in the request)). The same
//! code is correct on one local file and on a libSQL server shared by many replicas.

pub mod audit;
pub mod capacity;
pub mod idempotency;
pub mod keys;
pub mod market;
#[cfg(feature = "native")]
pub mod native;
pub mod nodes;
pub mod orgs;
pub mod reservations;
mod rows;
pub mod schema;
pub mod storage;
mod tx;
pub mod vms;

use reservations_domain::access::Caller;
use reservations_domain::{DomainError, Timestamp};

pub use storage::{KeyValue, Sql, SqlRows, SqlValue, StorageError};

/// Why a store operation did not happen. Either way nothing was written.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreError {
    /// A rule refused the request.
    Domain(DomainError),
    /// The database failed (after retries, if it was busy).
    Storage(StorageError),
}

impl From<DomainError> for StoreError {
    fn from(e: DomainError) -> Self {
        StoreError::Domain(e)
    }
}

impl From<StorageError> for StoreError {
    fn from(e: StorageError) -> Self {
        StoreError::Storage(e)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Domain(e) => e.fmt(f),
            StoreError::Storage(e) => e.fmt(f),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Who is acting, when, and under which request id: what every audit event records.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub caller: &'a Caller,
    pub now: Timestamp,
    /// The server's own id of the request.
    pub request_id: &'a str,
    /// The id the client sent (`x-request-id`), recorded beside the server's.
    pub client_request_id: Option<&'a str>,
}

/// The database, as the rest of the system sees it.
pub struct Store<'a> {
    connection: tx::Connection<'a>,
    audit_key: &'a [u8],
}

impl<'a> Store<'a> {
    /// Opens the store on a connection and brings its schema up to date at once. Its audit
    /// chain is keyed with the empty key: for tests and tools; the app uses [`Store::keyed`].
    pub fn open(db: &'a dyn Sql) -> Result<Store<'a>> {
        schema::migrate(db)?;
        Store::keyed(db, &[])
    }

    /// Opens the store with the secret that keys the audit chain's hashes. Nothing is sent
    /// to the database: a schema that is behind is brought up to date by the first statement
    /// that needs it (see [`tx::Connection`]).
    pub fn keyed(db: &'a dyn Sql, audit_key: &'a [u8]) -> Result<Store<'a>> {
        Ok(Store {
            connection: tx::Connection::new(db),
            audit_key,
        })
    }

    pub(crate) fn db(&self) -> &tx::Connection<'a> {
        &self.connection
    }

    pub(crate) fn audit_key(&self) -> &'a [u8] {
        self.audit_key
    }
}

/// A page of a listing and the cursor of the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// A page from a query that fetched one row more than `limit`: that extra row only says
    /// a next page exists, whose cursor is the last item kept.
    pub(crate) fn from_overfetched(
        mut items: Vec<T>,
        limit: usize,
        cursor_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(cursor_of)
        } else {
            None
        };
        Page { items, next_cursor }
    }
}
