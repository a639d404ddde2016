//! The tuned backend's connection pool: idle connections to one database file, reused across
//! requests, and the writer slot that queues this process's write transactions (see
//! [`super::scheduler`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use tokio::sync::Semaphore;

use super::super::backend::{BoxFuture, Database};
use super::super::{Error, file};
use super::scheduler::{INLINE_DEADLINE, TunedConnection};

/// Idle connections kept per database.
const MAX_IDLE_CONNECTIONS: usize = 64;
/// Prepared statements cached per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;
/// SQLite VM instructions between two looks at the inline budget.
const PROGRESS_CHECK_OPS: i32 = 1000;

/// A pool of connections to one database file.
pub struct ConnectionPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// One permit: the write transaction of this process that may run now.
    /// Tokio's semaphore is fair, so writers get the database in arrival order.
    pub(super) writer: Arc<Semaphore>,
}

impl ConnectionPool {
    /// Creates the pool and checks that the database can be opened.
    pub fn open(path: &Path) -> anyhow::Result<Arc<Self>> {
        let pool = Arc::new(Self {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
            writer: Arc::new(Semaphore::new(1)),
        });
        let conn = pool
            .connect()
            .map_err(|e| anyhow::anyhow!("cannot open SQLite database {}: {e}", path.display()))?;
        pool.give_back(conn);
        Ok(pool)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new connection as Spin opens one, plus what the tuned scheduler relies on.
    fn connect(&self) -> rusqlite::Result<Connection> {
        let mut conn = file::open(&self.path)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        // The query planner's stability guarantee: a cached statement is not re-planned each
        // time it is bound to new values (with `SQLITE_ENABLE_STAT4`, every join was).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        conn.progress_handler(
            PROGRESS_CHECK_OPS,
            Some(|| {
                INLINE_DEADLINE.with(|deadline| deadline.get().is_some_and(|d| Instant::now() >= d))
            }),
        )?;
        Ok(conn)
    }

    /// An idle connection, if there is one.
    pub(super) fn take_idle(&self) -> Option<Connection> {
        self.lock().pop()
    }

    /// A connection from the pool, or a new one, and whether its database is in WAL mode.
    pub(super) fn take(&self) -> rusqlite::Result<(Connection, bool)> {
        let pooled = self.lock().pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => self.connect()?,
        };
        let wal = is_wal(&conn)?;
        Ok((conn, wal))
    }

    /// Returns a connection, rolling back a transaction the guest left open.
    pub(super) fn give_back(&self, conn: Connection) {
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            // Could not restore a clean state: close it instead of reusing it.
            return;
        }
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of idle connections (for tests).
    pub fn idle_connections(&self) -> usize {
        self.lock().len()
    }
}

/// The tuned backend of one database file.
pub struct TunedDatabase(pub Arc<ConnectionPool>);

impl Database for TunedDatabase {
    fn open(&self) -> BoxFuture<'_, Result<Box<dyn super::super::Connection>, Error>> {
        let conn = TunedConnection::new(self.0.clone());
        Box::pin(async move { Ok(Box::new(conn) as Box<dyn super::super::Connection>) })
    }
}

pub(super) fn is_wal(conn: &Connection) -> rusqlite::Result<bool> {
    let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    Ok(mode.eq_ignore_ascii_case("wal"))
}
