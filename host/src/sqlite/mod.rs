//! `fermyon:spin/sqlite@2.0.0`: the WIT binding ([`binding`]) over database backends
//! ([`backend`]'s `Database` and `Connection` traits), as Spin's SQLite factor is built.
//!
//! The `default` database is `<state-dir>/sqlite_db.db`, as with `spin up`, run by one of two
//! backends of a local file, chosen by [`SqliteMode`]:
//! - [`SqliteMode::Spin`] (the default, [`spin_like`]): what Spin does, and costs - a new
//!   connection per guest `open`, each statement on a blocking thread, SQLite's own busy
//!   handling with a 5 s timeout;
//! - [`SqliteMode::Tuned`] ([`tuned`]): pooled connections, reads of a WAL database inline
//!   on the worker, a first-come-first-served queue of writers.
//!
//! The runtime config may put a label on a libSQL server instead ([`libsql`]).
//!
//! Both refuse `ATTACH` of a file as Spin does ([`file::refuse_attach`]). The binding counts
//! every statement per request and per host ([`stats`]), split by whether it ran inside a
//! write transaction ([`classify`] tells the statements apart).

pub mod backend;
pub mod binding;
pub mod classify;
pub mod file;
pub mod libsql;
pub mod result;
pub mod spin_like;
pub mod stats;
pub mod tuned;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

pub use self::backend::{BoxFuture, Connection, Database};
pub use self::binding::{Databases, Sqlite, SqliteConnection, SqliteState, SqliteView};
pub use self::stats::{StatementCounter, StatementCounts};
pub(crate) use crate::bindings::fermyon::spin::sqlite as wit;
pub use crate::bindings::fermyon::spin::sqlite::{Error, QueryResult, RowResult, Value};

/// The database label `spin up` defines without a runtime config.
pub const DEFAULT_DATABASE: &str = "default";

/// How the local SQLite file is run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SqliteMode {
    /// As Spin runs it: a connection per open, statements on blocking threads.
    #[default]
    Spin,
    /// Pooled connections, inline reads, a queue of writers.
    Tuned,
}

impl fmt::Display for SqliteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SqliteMode::Spin => "spin",
            SqliteMode::Tuned => "tuned",
        })
    }
}

impl FromStr for SqliteMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spin" => Ok(SqliteMode::Spin),
            "tuned" => Ok(SqliteMode::Tuned),
            other => Err(format!("unknown SQLite mode {other:?}: spin or tuned")),
        }
    }
}

/// The backend of a local database file in `mode` (the file is created if missing).
pub fn open_local(mode: SqliteMode, path: &Path) -> anyhow::Result<Arc<dyn Database>> {
    Ok(match mode {
        SqliteMode::Spin => Arc::new(spin_like::SpinLikeDatabase::open(path)?),
        SqliteMode::Tuned => Arc::new(tuned::TunedDatabase(tuned::ConnectionPool::open(path)?)),
    })
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::PathBuf;

    use super::{QueryResult, Value};

    /// A fresh database path under the temp dir.
    pub fn temp_db(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("spin-host-sqlite-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("db.sqlite")
    }

    /// The first value of the first row, which must be an integer.
    pub fn integer(result: &QueryResult) -> i64 {
        match result.rows[0].values[0] {
            Value::Integer(n) => n,
            ref other => panic!("not an integer: {other:?}"),
        }
    }
}
