//! `fermyon:spin/sqlite@2.0.0`, backed by a local SQLite file like `spin up`'s
//! default database: `default` is `<state-dir>/sqlite_db.db`.
//!
//! Access follows Spin: a database the component did not declare in
//! `sqlite_databases` is `access-denied`; a declared one that does not exist
//! is `no-such-database` (the host refuses to start with such a label).
//! SQLite errors reach the guest as `io(message)` with SQLite's own message
//! (e.g. `database is locked`).
//!
//! Connections are pooled: a guest's `open` borrows one from the pool (or
//! opens a new one), and dropping the resource - or the whole instance -
//! returns it, after rolling back any transaction the guest left open.
//! Statements are prepared through each connection's statement cache. Like
//! Spin, the host sets no journal mode and no busy timeout of its own beyond
//! the driver's default; components set their pragmas, and a pooled connection
//! keeps them. Statements run on blocking threads so a busy database never
//! stalls the HTTP workers.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use rusqlite::types::{Value as SqlValue, ValueRef};
use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::fermyon::spin::sqlite::{self as wit, Error, QueryResult, RowResult, Value};

/// The only database this host defines.
pub const DEFAULT_DATABASE: &str = "default";

/// Idle connections kept per database.
const MAX_IDLE_CONNECTIONS: usize = 64;
/// Prepared statements cached per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// A pool of connections to one database file.
pub struct ConnectionPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ConnectionPool {
    /// Creates the pool and checks that the database can be opened.
    pub fn open(path: &Path) -> anyhow::Result<Arc<Self>> {
        let pool = Arc::new(Self {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
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

    fn connect(&self) -> rusqlite::Result<Connection> {
        let conn = Connection::open(&self.path)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        Ok(conn)
    }

    /// A connection from the pool, or a new one.
    fn take(&self) -> rusqlite::Result<Connection> {
        let pooled = self.lock().pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => self.connect(),
        }
    }

    /// Returns a connection, rolling back a transaction the guest left open.
    fn give_back(&self, conn: Connection) {
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            // Could not restore a clean state: close it instead of reusing it.
            return;
        }
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of idle connections (for tests).
    pub fn idle_connections(&self) -> usize {
        self.lock().len()
    }
}

/// The guest's `connection` resource: a pooled connection, borrowed lazily on
/// the first statement and given back when the resource is dropped.
pub struct SqliteConnection {
    pool: Arc<ConnectionPool>,
    conn: Option<Connection>,
}

impl Drop for SqliteConnection {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let pool = self.pool.clone();
        if conn.is_autocommit() {
            pool.give_back(conn);
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // A rollback touches the disk: keep it off the async workers.
            handle.spawn_blocking(move || pool.give_back(conn));
        } else {
            pool.give_back(conn);
        }
    }
}

/// Per-instance state: which databases the component may open.
pub struct SqliteState {
    pub(crate) allowed: Arc<HashSet<String>>,
    pub(crate) default: Arc<ConnectionPool>,
}

/// What the generated bindings operate on.
pub struct SqliteView<'a> {
    pub(crate) state: &'a SqliteState,
    pub(crate) table: &'a mut ResourceTable,
}

/// [`HasData`] marker for linking the SQLite interface.
pub struct Sqlite;

impl HasData for Sqlite {
    type Data<'a> = SqliteView<'a>;
}

impl wit::Host for SqliteView<'_> {}

impl wit::HostConnection for SqliteView<'_> {
    async fn open(
        &mut self,
        database: String,
    ) -> wasmtime::Result<Result<Resource<SqliteConnection>, Error>> {
        if !self.state.allowed.contains(&database) {
            return Ok(Err(Error::AccessDenied));
        }
        if database != DEFAULT_DATABASE {
            return Ok(Err(Error::NoSuchDatabase));
        }
        let conn = SqliteConnection {
            pool: self.state.default.clone(),
            conn: None,
        };
        match self.table.push(conn) {
            Ok(resource) => Ok(Ok(resource)),
            Err(e) => Ok(Err(Error::Io(format!("too many connections opened: {e}")))),
        }
    }

    async fn execute(
        &mut self,
        connection: Resource<SqliteConnection>,
        statement: String,
        parameters: Vec<Value>,
    ) -> wasmtime::Result<Result<QueryResult, Error>> {
        let resource = self.table.get_mut(&connection)?;
        let pool = resource.pool.clone();
        let conn = resource.conn.take();
        let outcome = tokio::task::spawn_blocking(move || {
            let conn = match conn {
                Some(conn) => conn,
                None => match pool.take() {
                    Ok(conn) => conn,
                    Err(e) => return (None, Err(Error::Io(e.to_string()))),
                },
            };
            let result = run(&conn, &statement, parameters);
            (Some(conn), result)
        })
        .await;
        let (conn, result) = match outcome {
            Ok(outcome) => outcome,
            Err(e) => (None, Err(Error::Io(format!("SQLite task failed: {e}")))),
        };
        if let Some(conn) = conn {
            // The guest cannot drop the resource while a call on it is running.
            self.table.get_mut(&connection)?.conn = Some(conn);
        }
        Ok(result)
    }

    async fn drop(&mut self, connection: Resource<SqliteConnection>) -> wasmtime::Result<()> {
        // `SqliteConnection`'s `Drop` returns the connection to the pool.
        self.table.delete(connection)?;
        Ok(())
    }
}

/// Runs one statement with positional parameters.
fn run(conn: &Connection, statement: &str, parameters: Vec<Value>) -> Result<QueryResult, Error> {
    let io = |e: rusqlite::Error| Error::Io(e.to_string());
    let mut stmt = conn.prepare_cached(statement).map_err(io)?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let params = rusqlite::params_from_iter(parameters.into_iter().map(|v| match v {
        Value::Integer(i) => SqlValue::Integer(i),
        Value::Real(r) => SqlValue::Real(r),
        Value::Text(t) => SqlValue::Text(t),
        Value::Blob(b) => SqlValue::Blob(b),
        Value::Null => SqlValue::Null,
    }));
    let mut rows = stmt.query(params).map_err(io)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(io)? {
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            values.push(match row.get_ref(i).map_err(io)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => Value::Integer(i),
                ValueRef::Real(r) => Value::Real(r),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            });
        }
        out.push(RowResult { values });
    }
    Ok(QueryResult { columns, rows: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_db(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("spin-host-sqlite-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db.sqlite");
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn runs_statements_with_all_value_types() {
        let pool = ConnectionPool::open(&temp_db("types")).unwrap();
        let conn = pool.take().unwrap();
        run(
            &conn,
            "CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, n)",
            vec![],
        )
        .unwrap();
        let inserted = run(
            &conn,
            "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
            vec![
                Value::Integer(-7),
                Value::Real(1.5),
                Value::Text("héllo".into()),
                Value::Blob(vec![0, 255, 1]),
                Value::Null,
            ],
        )
        .unwrap();
        assert!(inserted.columns.is_empty() && inserted.rows.is_empty());
        let q = run(&conn, "SELECT i, r, s, b, n FROM t", vec![]).unwrap();
        assert_eq!(q.columns, vec!["i", "r", "s", "b", "n"]);
        assert_eq!(q.rows.len(), 1);
        let v = &q.rows[0].values;
        assert!(matches!(v[0], Value::Integer(-7)));
        assert!(matches!(v[1], Value::Real(r) if r == 1.5));
        assert!(matches!(&v[2], Value::Text(s) if s == "héllo"));
        assert!(matches!(&v[3], Value::Blob(b) if b == &[0, 255, 1]));
        assert!(matches!(v[4], Value::Null));
    }

    #[test]
    fn errors_carry_sqlite_messages() {
        let pool = ConnectionPool::open(&temp_db("errors")).unwrap();
        let conn = pool.take().unwrap();
        match run(&conn, "SELECT * FROM missing", vec![]) {
            Err(Error::Io(m)) => assert!(m.contains("no such table"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn open_transaction_is_rolled_back_before_reuse() {
        let pool = ConnectionPool::open(&temp_db("rollback")).unwrap();
        let conn = pool.take().unwrap();
        run(&conn, "CREATE TABLE t (x)", vec![]).unwrap();
        run(&conn, "BEGIN IMMEDIATE", vec![]).unwrap();
        run(&conn, "INSERT INTO t VALUES (1)", vec![]).unwrap();
        assert!(!conn.is_autocommit());
        drop(SqliteConnection {
            pool: pool.clone(),
            conn: Some(conn),
        });
        assert_eq!(pool.idle_connections(), 1);
        let conn = pool.take().unwrap();
        assert!(conn.is_autocommit());
        let q = run(&conn, "SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(q.rows[0].values[0], Value::Integer(0)));
    }
}
