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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The database could not run this now, and nothing of it was kept: another writer held
    /// the lock, or took it after a transaction ran too long (libSQL's "Transaction timed
    /// out"), the server expired the session, interrupted the statement or had too many
    /// requests in flight to take it. Run it again.
    #[error("database busy: {0}")]
    Busy(String),
    /// The store could not be reached at all (connection refused, reset, timed out).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The server took the statement and did not answer in time (a stalled server): it may
    /// still run it. Trying again would only wait as long again.
    #[error("storage did not answer: {0}")]
    Unanswered(String),
    /// A constraint (unique index, trigger) refused the write.
    #[error("constraint: {0}")]
    Constraint(String),
    /// The write was planned on facts that changed before it ran (its audit chain moved, or
    /// its idempotency key was recorded meanwhile): nothing of it was kept; plan it again.
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("storage: {0}")]
    Other(String),
}

/// What libSQL's client says when a connection's server-side session (a Hrana stream) is
/// gone: the statement did not run, and a new connection runs it.
const SESSION_LOST: &[&str] = &[
    "stream_expired",
    "stream has expired",
    "stream handle",
    "baton",
];

impl StorageError {
    /// Whether `message` says the connection's server-side session is gone.
    pub fn is_session_lost(message: &str) -> bool {
        let lower = message.to_ascii_lowercase();
        SESSION_LOST.iter().any(|needle| lower.contains(needle))
    }

    /// Classifies an SQLite (or libSQL, or key-value) error message, which is all Spin's
    /// interface passes on.
    pub fn from_sqlite_message(message: String) -> StorageError {
        let lower = message.to_ascii_lowercase();
        let any = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
        if lower.contains("did not answer within") {
            StorageError::Unanswered(message)
        } else if any(SESSION_LOST)
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
            StorageError::Busy(message)
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
            StorageError::Unavailable(message)
        } else if lower.contains("conflict: ")
            || lower.contains("audit_events.chain")
            || lower.contains("idempotency_records.caller_key_id")
        {
            StorageError::Conflict(message)
        } else if lower.contains("constraint") || lower.contains("refused:") {
            StorageError::Constraint(message)
        } else {
            StorageError::Other(message)
        }
    }
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
    use super::StorageError;

    fn kind(message: &str) -> &'static str {
        match StorageError::from_sqlite_message(message.to_owned()) {
            StorageError::Busy(_) => "busy",
            StorageError::Unavailable(_) => "unavailable",
            StorageError::Unanswered(_) => "unanswered",
            StorageError::Constraint(_) => "constraint",
            StorageError::Conflict(_) => "conflict",
            StorageError::Other(_) => "other",
        }
    }

    #[test]
    fn a_lost_session_is_told_by_the_one_list_of_its_markers() {
        assert!(StorageError::is_session_lost("Hrana: STREAM_EXPIRED"));
        assert!(StorageError::is_session_lost("invalid baton"));
        assert!(!StorageError::is_session_lost("database is locked"));
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
            ("refused: units-not-idle", "constraint"),
            (
                "UNIQUE constraint failed: vm_units.node_id, vm_units.unit_id",
                "constraint",
            ),
            ("the database did not answer within 10s", "unanswered"),
            ("no such table: writes", "other"),
        ];
        for (message, expected) in rows {
            assert_eq!(kind(message), expected, "{message}");
        }
    }
}
