//! The boundary to the database: the two stores the system of record is written against
//! (an SQLite connection and a key-value store), every failure told apart once
//! ([`StorageError`]), the one [`Connection`] every statement of the store goes through, rows
//! read by column name ([`Row`]), every retry's policy, and the request's [`Tally`] of what it
//! ran. The two stores: The same SQL runs over Spin's SQLite and key-value interfaces (in the
//! components, `reservations-http`'s adapters) and over rusqlite (natively, in tests and
//! benchmarks: [`crate::native`]).

use crate::schema;
use crate::{Result, StoreError};
use reservations_domain::Timestamp;
use reservations_domain::time::from_millis;
use serde::de::DeserializeOwned;
use std::cell::Cell;
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// One SQLite value, as Spin's `sqlite` interface carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Null,
}

impl From<&str> for SqlValue {
    fn from(value: &str) -> Self {
        SqlValue::Text(value.to_owned())
    }
}

impl From<String> for SqlValue {
    fn from(value: String) -> Self {
        SqlValue::Text(value)
    }
}

impl From<&String> for SqlValue {
    fn from(value: &String) -> Self {
        SqlValue::Text(value.clone())
    }
}

impl From<i64> for SqlValue {
    fn from(value: i64) -> Self {
        SqlValue::Integer(value)
    }
}

impl From<bool> for SqlValue {
    fn from(value: bool) -> Self {
        SqlValue::Integer(value.into())
    }
}

impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(value: Option<T>) -> Self {
        value.map_or(SqlValue::Null, Into::into)
    }
}

/// The result of one statement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SqlRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<SqlValue>>,
}

/// A failure of the database or the key-value store, told apart once, where the driver's
/// message becomes one ([`StorageError::from_sqlite_message`]): nothing past that point reads
/// the message's words again. Each kind keeps the words ([`Message`]) for logs and answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The database could not run this now, and nothing of it was kept: another writer held
    /// the lock, or took it after a transaction ran too long (libSQL's "Transaction timed
    /// out"), the server expired the session, interrupted the statement or had too many
    /// requests in flight to take it. Run it again.
    #[error("database busy: {0}")]
    Busy(Message),
    /// The store could not be reached at all (connection refused, reset, timed out).
    #[error("storage unavailable: {0}")]
    Unavailable(Message),
    /// The server took the statement and did not answer in time (a stalled server): it may
    /// still run it. Trying again would only wait as long again.
    #[error("storage did not answer: {0}")]
    Unanswered(Message),
    /// One of the schema's guards refused the write.
    #[error("constraint: {1}")]
    Refused(Guard, Message),
    /// A constraint that is none of the schema's guards refused the write (a `NOT NULL`, or
    /// a refusal whose code this build does not know).
    #[error("constraint: {0}")]
    Constraint(Message),
    /// The write was planned on facts that changed before it ran, or its idempotency key was
    /// recorded meanwhile: nothing of it was kept.
    #[error("conflict: {1}")]
    Conflict(Conflict, Message),
    /// The schema is older than the statement: it names a table, column or index a newer
    /// migration adds, or it is the write of a newer build (`behind: schema`). Migrating and
    /// running it again is the answer (see [`crate::storage`]).
    #[error("storage: {1}")]
    Behind(Lacking, Message),
    #[error("storage: {0}")]
    Other(Message),
}

/// What a failure says in words, and what those words tell of the connection it failed on,
/// told with its kind where the driver's message became a [`StorageError`]. A failure the
/// store makes itself (`"…".into()`) tells nothing of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    text: String,
    /// An edge site's replica forwarded the statement to the primary, and the failure came
    /// back from there (or from the way there): sqld's message for it.
    forwarded: bool,
    /// libSQL's server-side session of the connection is gone (a Hrana stream expired, its
    /// baton invalid): the statement did not run, and a new connection runs the next.
    session_lost: bool,
}

impl Message {
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<String> for Message {
    fn from(text: String) -> Message {
        Message {
            text,
            forwarded: false,
            session_lost: false,
        }
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Message {
        Message::from(text.to_owned())
    }
}

/// A guard of the schema refusing a write: one of its own refusals (`RAISE(ABORT, 'refused:
/// <code>')` in schema/objects.sql), or a unique constraint the write statement can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The caller's key was revoked after the request was authenticated.
    KeyRevoked,
    /// A unit running a non-spot VM is not released.
    UnitsNotIdle,
    /// A released unit takes spot VMs only.
    ReleasedSpotOnly,
    /// Nothing is placed on the units of a `needs-review` reservation.
    WithheldNeedsReview,
    /// A notice is never lengthened.
    NoticeLengthened,
    /// A notice is given to spot VMs only.
    NoticeOnNonSpotVm,
    /// A VM's rows never come back to running, nor change tier.
    VmRowsAreFinal,
    /// A unit runs at most one running VM (the unique index `one_running_vm_per_unit`).
    UnitBusy,
    /// A VM's id is taken (the primary key of `vms`).
    VmIdTaken,
}

impl Guard {
    /// The guard that refused the statement, if one did.
    pub fn of(error: &StorageError) -> Option<Guard> {
        match error {
            StorageError::Refused(guard, _) => Some(*guard),
            _ => None,
        }
    }

    /// The guard a schema's refusal names (`refused: <code>`).
    fn refusing(code: &str) -> Option<Guard> {
        Some(match code {
            "key-revoked" => Guard::KeyRevoked,
            "units-not-idle" => Guard::UnitsNotIdle,
            "released-spot-only" => Guard::ReleasedSpotOnly,
            "withheld-needs-review" => Guard::WithheldNeedsReview,
            "notice-lengthened" => Guard::NoticeLengthened,
            "notice-on-non-spot-vm" => Guard::NoticeOnNonSpotVm,
            "vm-rows-are-final" => Guard::VmRowsAreFinal,
            _ => return None,
        })
    }
}

/// Why the write statement found its plan overtaken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// A fact the write was planned on moved before it ran (`conflict: facts-moved`, or its
    /// event's place in its chain taken), as any other conflict the statement reports: plan
    /// it again.
    FactsMoved,
    /// The write's idempotency key was recorded meanwhile, by a duplicate on any replica
    /// (`conflict: idempotency-key-recorded`, or the record's primary key): answer the
    /// recorded request.
    KeyRecorded,
}

/// What the schema lacks that a statement needs ([`StorageError::Behind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lacking {
    Table,
    Column,
    Index,
    /// The version of the write's build: the write trigger refused the write of a newer
    /// build (`behind: schema`).
    Version,
}

/// What libSQL's client says when a connection's server-side session (a Hrana stream) is
/// gone: the statement did not run, and a new connection runs it.
const SESSION_LOST: &[&str] = &[
    "stream_expired",
    "stream has expired",
    "stream handle",
    "baton",
];

/// What sqld says of a statement its replica forwarded to the primary that failed there or
/// on the way: its words, and its Hrana error code, spelled as sqld spells them.
const FORWARDED: &[&str] = &["on the primary", "PROXY_ERROR"];

/// The words of each thing a schema can lack, lower case, the first that a message holds
/// telling which.
const LACKING: &[(&str, Lacking)] = &[
    ("no such table", Lacking::Table),
    ("no such column", Lacking::Column),
    ("has no column named", Lacking::Column),
    ("no such index", Lacking::Index),
    ("behind: schema", Lacking::Version),
];

impl StorageError {
    /// Tells apart an SQLite (or libSQL, or key-value) error message, which is all Spin's
    /// interface passes on: the one place that reads a driver's words.
    pub fn from_sqlite_message(message: String) -> StorageError {
        let lower = message.to_ascii_lowercase();
        let any = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
        let session_lost = any(SESSION_LOST);
        let words = Message {
            forwarded: FORWARDED.iter().any(|mark| message.contains(mark)),
            session_lost,
            text: message,
        };
        if lower.contains("did not answer within") {
            StorageError::Unanswered(words)
        } else if session_lost
            || any(&[
                "database is locked",
                "database table is locked",
                "busy",
                "transaction timed out",
                "transaction_timeout",
                "cannot handle additional transactions",
                // sqld's bound on requests in flight (`--max-concurrent-requests`, 128 by
                // default): it refused the statement before running it.
                "too many concurrent requests",
                // sqld's bound on connections (`--max-concurrent-connections`, 128 by default):
                // it answered, but no connection came free in time, so nothing ran.
                "timed out while opening database connection",
                // sqld may cancel a statement of a stream whose earlier cursor it dropped
                // (SQLITE_INTERRUPT): the statement did not run, and running it again is safe,
                // since a write is planned again from fresh facts.
                "interrupted",
            ])
        {
            StorageError::Busy(words)
        } else if any(&[
            "connection refused",
            "connection reset",
            "connection closed",
            "connection aborted",
            "broken pipe",
            "error trying to connect",
            "tcp connect",
            "dns error",
            "no route to host",
            "network is unreachable",
            "timed out",
            "service unavailable",
            "unexpected eof",
        ]) {
            StorageError::Unavailable(words)
        } else if any(&[
            "conflict: ",
            "audit_events.chain",
            "idempotency_records.caller_key_id",
        ]) {
            StorageError::Conflict(conflict(&words.text), words)
        } else if let Some(&(_, lacking)) =
            LACKING.iter().find(|(needle, _)| lower.contains(needle))
        {
            // Told before a guard: the statement runs again on the migrated schema, where a
            // guard may still refuse it.
            StorageError::Behind(lacking, words)
        } else if let Some(guard) = guard(&words.text) {
            StorageError::Refused(guard, words)
        } else if any(&["constraint", "refused:"]) {
            StorageError::Constraint(words)
        } else {
            StorageError::Other(words)
        }
    }

    /// The failure's words, and what they tell of its connection.
    pub fn message(&self) -> &Message {
        match self {
            StorageError::Busy(message)
            | StorageError::Unavailable(message)
            | StorageError::Unanswered(message)
            | StorageError::Refused(_, message)
            | StorageError::Constraint(message)
            | StorageError::Conflict(_, message)
            | StorageError::Behind(_, message)
            | StorageError::Other(message) => message,
        }
    }

    /// Whether the connection's server-side session is gone: a new connection runs the next
    /// statement.
    pub fn session_lost(&self) -> bool {
        self.message().session_lost
    }

    /// Whether an edge site's replica forwarded the statement to the primary, where (or on
    /// the way to which) it failed.
    pub fn forwarded(&self) -> bool {
        self.message().forwarded
    }
}

/// The conflict a write statement reports.
fn conflict(message: &str) -> Conflict {
    match code_after(message, "conflict: ") {
        Some("facts-moved") => Conflict::FactsMoved,
        Some("idempotency-key-recorded") => Conflict::KeyRecorded,
        _ if message.contains("idempotency_records") => Conflict::KeyRecorded,
        _ => Conflict::FactsMoved,
    }
}

/// The guard a refusal names, if it names one the schema has.
fn guard(message: &str) -> Option<Guard> {
    if let Some(code) = code_after(message, "refused: ") {
        return Guard::refusing(code);
    }
    if message.contains("UNIQUE") && message.contains("vm_units") {
        return Some(Guard::UnitBusy);
    }
    message.contains("vms.id").then_some(Guard::VmIdTaken)
}

/// The code after `prefix` in a driver's message (`refused: units-not-idle (code 1811)` →
/// `units-not-idle`).
fn code_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// A connection to an SQLite database: one statement at a time, positional parameters.
pub trait Sql {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError>;

    /// Runs the next statement on a connection of its own, one that has run nothing before
    /// (later statements stay on it). At an edge site this is what keeps a read at the
    /// site's copy: sqld's replica may run every program of a connection at the primary once
    /// one of its answers was cut short (docs/design.md, "Edge sites"). Where a connection
    /// is the database itself (a local file), there is nothing to do.
    fn next_on_a_new_connection(&self) {}
}

/// A key-value store of byte values.
pub trait KeyValue {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError>;
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StorageError>;
    fn delete(&self, key: &str) -> Result<(), StorageError>;
}

/// Counters that every request sharing the store sees, moved only by atomic increments.
pub trait Counters {
    /// Adds `delta` to the counter at `key` (absent counts as 0); its new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StorageError>;
    /// The counter at `key` (absent counts as 0).
    fn read(&self, key: &str) -> Result<i64, StorageError>;
    fn remove(&self, key: &str) -> Result<(), StorageError>;
}

// ============================================================================================
// The connection
//
// The store's connection: every statement of the store goes through one [`Connection`],
// which notices when the schema is behind (a statement fails on a table or column a newer
// migration adds): it brings the schema up to date and runs the statement again, so no
// request pays for a version check.
//
// It also makes reads never answer busy. In WAL mode a read waits for no writer, yet over
// libSQL a read can still fail for a moment: sqld refuses a statement past its bound on
// requests in flight ("Too many concurrent requests"), cancels one on a stream whose earlier
// cursor it dropped (SQLITE_INTERRUPT), or the stream expired; a local file can be locked
// while a checkpoint resets the WAL. None of these ran the read, so a read outside an
// explicit transaction is run again, with the same bounded, jittered back-off as every
// retry (the policy below), rather than answered 503. Writes are not retried here: the write
// path decides itself whether a failed write may have landed.
//
// At an edge site, every statement outside an explicit transaction after the connection's
// first runs on a connection of its own ([`Sql::next_on_a_new_connection`]), so that sqld's
// replica runs a read at the site's copy and forwards only writes (docs/design.md, "Edge
// sites": a replica's connection can be left forwarding everything).

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

// ============================================================================================
// Rows read by column name
//
// Reading typed values out of result rows by column name, and small SQL helpers.

/// One row of a result, read by the names its statement gives its columns.
pub(crate) struct Row<'r> {
    columns: &'r [String],
    values: &'r [SqlValue],
}

fn wrong_type(column: &str, want: &str, got: &SqlValue) -> StorageError {
    StorageError::Other(format!("column {column}: expected {want}, found {got:?}").into())
}

impl<'r> Row<'r> {
    /// The value of a column; an error names a column the statement does not return. Names
    /// match as SQL's do, whatever their case: sqld spells an alias that is also a keyword
    /// (`AS action`) in capitals.
    pub fn value(&self, column: &str) -> Result<&'r SqlValue, StorageError> {
        self.columns
            .iter()
            .position(|name| name.eq_ignore_ascii_case(column))
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| {
                StorageError::Other(
                    format!(
                        "no column {column} in the result (columns: {})",
                        self.columns.join(", ")
                    )
                    .into(),
                )
            })
    }

    pub fn text(&self, column: &str) -> Result<String, StorageError> {
        match self.value(column)? {
            SqlValue::Text(s) => Ok(s.clone()),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    pub fn opt_text(&self, column: &str) -> Result<Option<String>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.text(column).map(Some),
        }
    }

    pub fn int(&self, column: &str) -> Result<i64, StorageError> {
        match self.value(column)? {
            SqlValue::Integer(n) => Ok(*n),
            other => Err(wrong_type(column, "integer", other)),
        }
    }

    pub fn opt_int(&self, column: &str) -> Result<Option<i64>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.int(column).map(Some),
        }
    }

    pub fn bool(&self, column: &str) -> Result<bool, StorageError> {
        self.int(column).map(|n| n != 0)
    }

    pub fn time(&self, column: &str) -> Result<Timestamp, StorageError> {
        self.int(column).map(from_millis)
    }

    pub fn opt_time(&self, column: &str) -> Result<Option<Timestamp>, StorageError> {
        Ok(self.opt_int(column)?.map(from_millis))
    }

    /// A JSON text column (org lists, and what statements aggregate with `json_group_array`).
    pub fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T, StorageError> {
        let text = self.text(column)?;
        serde_json::from_str(&text)
            .map_err(|e| StorageError::Other(format!("column {column}: bad JSON: {e}").into()))
    }

    pub fn opt_json<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.json(column).map(Some),
        }
    }

    /// A JSON array of strings, as org lists are stored.
    pub fn string_list(&self, column: &str) -> Result<Vec<String>, StorageError> {
        self.json(column)
    }

    /// A stored name parsed into its type; `what` names the type in the error.
    pub fn parsed<T>(
        &self,
        column: &str,
        what: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, StorageError> {
        let name = self.text(column)?;
        parse(&name).ok_or_else(|| {
            StorageError::Other(format!("column {column}: unknown {what} {name:?}").into())
        })
    }
}

pub(crate) fn rows(result: &SqlRows) -> impl Iterator<Item = Row<'_>> {
    result.rows.iter().map(|values| Row {
        columns: &result.columns,
        values,
    })
}

/// The first row of a result, if any.
pub(crate) fn first_row(result: &SqlRows) -> Option<Row<'_>> {
    rows(result).next()
}

pub(crate) fn json_list(items: &[String]) -> SqlValue {
    SqlValue::Text(serde_json::to_string(items).expect("a list of strings serializes"))
}

pub(crate) fn millis(t: Timestamp) -> SqlValue {
    SqlValue::Integer(t.timestamp_millis())
}

/// Parameters are borrowed from many places; this keeps call sites short.
pub(crate) fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_owned())
}

/// `?, ?, ?` for `n` parameters.
pub(crate) fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

pub(crate) fn exec(db: &dyn Sql, sql: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
    db.execute(sql, params)
}

/// Reads a listing's row with `read`; a row it cannot read is an [`crate::UnreadableRow`]
/// named by its `key_column` (as text, whatever it holds).
pub(crate) fn read_listed<T>(
    row: &Row<'_>,
    key_column: &str,
    read: impl FnOnce(&Row<'_>) -> Result<T, StorageError>,
) -> Result<T, crate::UnreadableRow> {
    read(row).map_err(|e| crate::UnreadableRow {
        key: match row.value(key_column) {
            Ok(SqlValue::Text(key)) => key.clone(),
            Ok(SqlValue::Integer(key)) => key.to_string(),
            Ok(other) => format!("{other:?}"),
            Err(_) => String::new(),
        },
        error: e.to_string(),
    })
}

// ============================================================================================
// Every retry
//
// Every retry of the store, in one place: what is tried again, how often, and how long it
// waits in between.
//
// - **Transient failures** (the database busy, or briefly unreachable): the same work again,
// after a growing, jittered [`backoff`], at most [`BUSY_ATTEMPTS`] or
// [`UNAVAILABLE_ATTEMPTS`] times. Reads are run again by the connection
// ([`crate::storage`]), migrations by their transaction ([`crate::tx`]), and a write by
// its loop ([`crate::write`]), which first looks whether a write whose answer was lost
// landed.
// - **Conflicts** (a fact a write's plan read moved before its statement ran): planned again
// from fresh facts after a short [`conflict_backoff`], at most [`WRITE_ATTEMPTS`] times, then
// refused as contention.
// - **A duplicate under the same `Idempotency-Key`** recorded meanwhile: the key is looked up
// again, at most [`KEYED_LOOKUPS`] times.
// - **A turn in the org's share of the writes** ([`crate::share`]): looked for again after
// [`share_backoff`], for at most [`SHARE_WAIT`], then refused as contention.
// - **Spin's local key-value store locked** by another instance: the operation again after
// [`key_value_backoff`], at most [`KEY_VALUE_LOCKED_ATTEMPTS`] times (the components'
// adapter, `shared/http/src/config.rs`).

/// How often work is tried while the database is busy.
pub const BUSY_ATTEMPTS: u32 = 12;
/// How often it is tried while the store cannot be reached: an unreachable store is
/// answered soon (503 with `Retry-After`) rather than waited for.
pub const UNAVAILABLE_ATTEMPTS: u32 = 3;

/// How often a mutation is planned and written while the facts it read keep moving. Each
/// conflict means another write that changed one of them committed, so with `n` writers on
/// the same unit the last of them waits about `n` rounds, and more when fresh writers keep
/// winning: 16 writers on one unit, 10 writes each, needed at most 33 to 49 attempts for a
/// write over ten runs on 2 cores (`write_races`), so the bound is twice that.
pub const WRITE_ATTEMPTS: u32 = 96;

/// How often a keyed request looks its key up again after a duplicate recorded it meanwhile
/// (its own write was then refused whole).
pub const KEYED_LOOKUPS: u32 = 3;

/// How often a key-value operation is tried while Spin's local store reports itself locked.
pub const KEY_VALUE_LOCKED_ATTEMPTS: u32 = 8;

/// How long to wait before key-value attempt `attempt + 1`: 4 ms doubling (to 512 ms before
/// the last).
pub fn key_value_backoff(attempt: u32) -> Duration {
    Duration::from_millis(2u64 << attempt.min(8))
}

/// How long a write waits for a turn in its org's share before it is refused.
pub const SHARE_WAIT: Duration = Duration::from_secs(10);

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

/// How long to wait before planning again after attempt `attempt` found its facts moved: a
/// random point below a cap that starts at 1 ms and doubles to 32 ms ("full jitter"). A
/// conflict means another write on the same facts just committed, so there is no point in
/// waiting long; the randomness spreads the writers that collided.
pub fn conflict_backoff(attempt: u32) -> Duration {
    let cap_us = 1_000u64 << attempt.saturating_sub(1).min(5);
    Duration::from_micros(random_below(cap_us + 1))
}

/// How long a write with `ahead` of its org's writes waiting before it (when it last tried)
/// waits before it looks at the count again: 2 ms more for each, up to 50 ms, and a random
/// part as long again.
pub fn share_backoff(ahead: i64) -> Duration {
    let base_us = (2_000 * ahead.max(1) as u64).min(50_000);
    Duration::from_micros(base_us + random_below(base_us))
}

// ============================================================================================
// The request's tally
//
// What the request being served has done so far, counted as it runs, for its log record
// (docs/design.md, "What an operator sees"): the statements it ran, the times it tried its
// write, and how long it waited for a site's copy or for a turn of its org's share. A
// component serves one request at a time on one thread, so the tally is the thread's.

/// The counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub statements: u32,
    pub write_attempts: u32,
    pub copy_wait: Duration,
    pub share_wait: Duration,
}

thread_local! {
    static TALLY: RefCell<Tally> = RefCell::new(Tally::default());
}

impl Tally {
    fn add(change: impl FnOnce(&mut Tally)) {
        TALLY.with(|tally| change(&mut tally.borrow_mut()));
    }

    pub fn statement_ran() {
        Tally::add(|t| t.statements += 1);
    }

    pub fn write_tried() {
        Tally::add(|t| t.write_attempts += 1);
    }

    pub fn waited_for_copy(waited: Duration) {
        Tally::add(|t| t.copy_wait += waited);
    }

    pub fn waited_for_share(waited: Duration) {
        Tally::add(|t| t.share_wait += waited);
    }

    /// The request's counts, the tally starting again from nothing.
    pub fn take() -> Tally {
        TALLY.with(|tally| std::mem::take(&mut *tally.borrow_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::{Conflict, Guard, Lacking, StorageError};

    fn told(message: &str) -> StorageError {
        StorageError::from_sqlite_message(message.to_owned())
    }

    fn kind(message: &str) -> &'static str {
        match told(message) {
            StorageError::Busy(_) => "busy",
            StorageError::Unavailable(_) => "unavailable",
            StorageError::Unanswered(_) => "unanswered",
            StorageError::Refused(..) => "refused",
            StorageError::Constraint(_) => "constraint",
            StorageError::Conflict(..) => "conflict",
            StorageError::Behind(..) => "behind",
            StorageError::Other(_) => "other",
        }
    }

    #[test]
    fn a_lost_session_is_told_by_the_one_list_of_its_markers() {
        assert!(told("Hrana: STREAM_EXPIRED").session_lost());
        assert!(told("invalid baton").session_lost());
        assert!(!told("database is locked").session_lost());
        assert!(!StorageError::Busy("invalid baton".into()).session_lost());
    }

    #[test]
    fn messages_are_classified_as_the_write_path_needs() {
        let rows = [
            ("SQLite error: database is locked", "busy"),
            (
                "Hrana: `api error: `{\"message\":\"stream_expired\"}``",
                "busy",
            ),
            ("the baton is invalid", "busy"),
            (
                "Hrana: `api error: `{\"message\":\"interrupted\",\"code\":\"SQLITE_INTERRUPT\"}``",
                "busy",
            ),
            (
                "error trying to connect: tcp connect error: Connection refused",
                "unavailable",
            ),
            (
                "Hrana: `api error: `{\"error\":\"Too many concurrent requests\"}``",
                "busy",
            ),
            (
                "Hrana: `api error: `{\"error\":\"Timed out while opening database connection\"}``",
                "busy",
            ),
            ("conflict: chain-moved", "conflict"),
            (
                "UNIQUE constraint failed: audit_events.chain, audit_events.chain_seq",
                "conflict",
            ),
            ("conflict: idempotency-key-recorded", "conflict"),
            ("refused: units-not-idle", "refused"),
            ("refused: something-new", "constraint"),
            (
                "UNIQUE constraint failed: vm_units.node_id, vm_units.unit_id",
                "refused",
            ),
            ("NOT NULL constraint failed: orgs.name", "constraint"),
            ("the database did not answer within 10s", "unanswered"),
            ("no such table: writes", "behind"),
            ("near \"SELEC\": syntax error", "other"),
        ];
        for (message, expected) in rows {
            assert_eq!(kind(message), expected, "{message}");
        }
    }

    #[test]
    fn each_guard_is_told_from_its_message_however_the_driver_words_it() {
        let cases = [
            ("refused: key-revoked", Some(Guard::KeyRevoked)),
            (
                "SQLite error: refused: units-not-idle (code 1811)",
                Some(Guard::UnitsNotIdle),
            ),
            ("refused: released-spot-only", Some(Guard::ReleasedSpotOnly)),
            (
                "refused: withheld-needs-review",
                Some(Guard::WithheldNeedsReview),
            ),
            ("refused: notice-lengthened", Some(Guard::NoticeLengthened)),
            (
                "refused: notice-on-non-spot-vm",
                Some(Guard::NoticeOnNonSpotVm),
            ),
            ("refused: vm-rows-are-final", Some(Guard::VmRowsAreFinal)),
            (
                "UNIQUE constraint failed: vm_units.node_id, vm_units.unit_id",
                Some(Guard::UnitBusy),
            ),
            ("UNIQUE constraint failed: vms.id", Some(Guard::VmIdTaken)),
            ("refused: something-new", None),
            ("NOT NULL constraint failed: orgs.name", None),
            ("SQLite error: conflict: facts-moved", None),
            ("database is locked; refused: key-revoked", None),
        ];
        for (message, guard) in cases {
            assert_eq!(Guard::of(&told(message)), guard, "{message}");
        }
    }

    #[test]
    fn each_conflict_is_told_from_its_message_however_the_driver_words_it() {
        let conflict = |message: &str| match told(message) {
            StorageError::Conflict(conflict, _) => Some(conflict),
            _ => None,
        };
        let cases = [
            ("SQLite error: conflict: facts-moved", Conflict::FactsMoved),
            ("conflict: idempotency-key-recorded", Conflict::KeyRecorded),
            (
                "UNIQUE constraint failed: idempotency_records.caller_key_id, \
                 idempotency_records.idempotency_key",
                Conflict::KeyRecorded,
            ),
            (
                "UNIQUE constraint failed: audit_events.chain, audit_events.chain_seq",
                Conflict::FactsMoved,
            ),
            ("conflict: chain-moved", Conflict::FactsMoved),
        ];
        for (message, expected) in cases {
            assert_eq!(conflict(message), Some(expected), "{message}");
        }
    }

    #[test]
    fn a_schema_behind_the_statement_is_told_with_what_it_lacks() {
        let cases = [
            ("no such table: site_probe_no_such_table", Lacking::Table),
            (
                "SQLite error: no such column: schema_version",
                Lacking::Column,
            ),
            (
                "table writes has no column named schema_version",
                Lacking::Column,
            ),
            ("no such index: audit_by_place", Lacking::Index),
            ("SQLite error: behind: schema", Lacking::Version),
        ];
        for (message, lacking) in cases {
            assert!(
                matches!(told(message), StorageError::Behind(l, _) if l == lacking),
                "{message}"
            );
        }
    }

    #[test]
    fn a_failure_at_the_primary_is_told_as_forwarded_whatever_its_kind() {
        let forwarded = told(
            "Hrana: `api error: `{\"message\":\"the statement failed on the primary: no such \
             table: site_probe_no_such_table\"}``",
        );
        assert!(forwarded.forwarded());
        assert!(matches!(forwarded, StorageError::Behind(Lacking::Table, _)));
        let unreachable = told(
            "Hrana: `api error: `{\"message\":\"error trying to connect: tcp connect error: \
             Connection refused\",\"code\":\"PROXY_ERROR\"}``",
        );
        assert!(unreachable.forwarded());
        assert!(matches!(unreachable, StorageError::Unavailable(_)));
        assert!(!told("no such table: site_probe_no_such_table").forwarded());
        assert!(!StorageError::Other("failed on the primary".into()).forwarded());
    }

    #[test]
    fn the_words_are_kept_as_the_driver_gave_them() {
        let message = "SQLite error: refused: units-not-idle (code 1811)";
        let error = told(message);
        assert_eq!(error.message().as_str(), message);
        assert_eq!(error.to_string(), format!("constraint: {message}"));
    }
}

#[cfg(test)]
mod connection_tests {
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
