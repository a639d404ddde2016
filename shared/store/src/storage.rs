//! The two stores the system of record is written against: an SQLite connection and a
//! key-value store. The same SQL runs over Spin's SQLite and key-value interfaces (in the
//! components, `reservations-http`'s adapters) and over rusqlite (natively, in tests and
//! benchmarks: [`crate::native`]).

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
    /// running it again is the answer (see [`crate::connection`]).
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
