//! `fermyon:spin/sqlite@2.0.0`, backed by a local SQLite file like `spin up`'s
//! default database: `default` is `<state-dir>/sqlite_db.db`. The runtime config may put
//! a label on another file or on a libSQL server ([`crate::libsql_backend`]); what follows
//! is about local files.
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
//! keeps them. Statements that may wait - for a lock, for the disk (`BEGIN
//! IMMEDIATE`, writes, `COMMIT`), or on a database not in WAL mode - run on
//! blocking threads so a busy database never stalls the HTTP workers. Reads of
//! a WAL database wait for nobody, and most take microseconds, far less than
//! handing them to another thread and back: they run on the calling worker,
//! within [`INLINE_BUDGET`]. One that needs longer is interrupted (which
//! changes nothing, as it only reads) and run again on a blocking thread.
//! Connections use SQLite's query-planner stability guarantee, so a cached
//! statement is not re-planned each time it is bound to new values (with
//! `SQLITE_ENABLE_STAT4`, every join was, on every request).
//!
//! Write transactions of this process queue for the database first come,
//! first served: a `BEGIN IMMEDIATE` / `BEGIN EXCLUSIVE` waits for the pool's
//! writer slot (at most the connection's `busy_timeout`, then it fails as
//! SQLite would, with `database is locked`) and holds it until the connection
//! is back in autocommit mode. Without the queue, concurrent writers poll the
//! lock with SQLite's busy handler, whose sleeps grow to 100 ms: under 32
//! concurrent writers a few waited over half a second while the lock was
//! free most of the time. Writers in other processes still meet SQLite's own
//! locking, as before.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, MAIN_DB, Statement, TransactionState};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::fermyon::spin::sqlite::{self as wit, Error, QueryResult, RowResult, Value};
use crate::libsql_backend::{LibsqlConnection, LibsqlDatabase};

/// The database every app has without a runtime config.
pub const DEFAULT_DATABASE: &str = "default";

/// What serves one database label.
#[derive(Clone)]
pub enum DatabaseBackend {
    /// A local SQLite file.
    Local(Arc<ConnectionPool>),
    /// A libSQL server.
    Libsql(Arc<LibsqlDatabase>),
}

/// The guest's `connection` resource.
pub enum GuestConnection {
    Local(SqliteConnection),
    Libsql(LibsqlConnection),
}

fn local_connection<'a>(
    table: &'a mut ResourceTable,
    connection: &Resource<GuestConnection>,
) -> wasmtime::Result<&'a mut SqliteConnection> {
    match table.get_mut(connection)? {
        GuestConnection::Local(local) => Ok(local),
        GuestConnection::Libsql(_) => Err(wasmtime::format_err!("not a local connection")),
    }
}

/// Idle connections kept per database.
const MAX_IDLE_CONNECTIONS: usize = 64;
/// Prepared statements cached per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;
/// How long a read may run on an HTTP worker before it moves to a blocking thread.
pub const INLINE_BUDGET: Duration = Duration::from_millis(1);
/// SQLite VM instructions between two looks at the budget.
const PROGRESS_CHECK_OPS: i32 = 1000;

thread_local! {
    /// While a read runs inline on this thread: when it must give up.
    static INLINE_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// A pool of connections to one database file.
pub struct ConnectionPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// One permit: the write transaction of this process that may run now.
    /// Tokio's semaphore is fair, so writers get the database in arrival order.
    writer: Arc<Semaphore>,
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

    fn connect(&self) -> rusqlite::Result<Connection> {
        let mut conn = Connection::open(&self.path)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
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
    fn take_idle(&self) -> Option<Connection> {
        self.lock().pop()
    }

    /// A connection from the pool, or a new one, and whether its database is in WAL mode.
    fn take(&self) -> rusqlite::Result<(Connection, bool)> {
        let pooled = self.lock().pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => self.connect()?,
        };
        let wal = is_wal(&conn)?;
        Ok((conn, wal))
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
    /// Whether the database was in WAL mode when the connection was borrowed (or after the
    /// guest last set the journal mode): only then do reads run inline.
    wal: bool,
    /// Held from `BEGIN IMMEDIATE` until the transaction ends.
    write_slot: Option<OwnedSemaphorePermit>,
}

impl Drop for SqliteConnection {
    fn drop(&mut self) {
        let write_slot = self.write_slot.take();
        let Some(conn) = self.conn.take() else {
            return;
        };
        let pool = self.pool.clone();
        if conn.is_autocommit() {
            pool.give_back(conn);
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // A rollback touches the disk: keep it off the async workers. The
            // next writer waits for it.
            handle.spawn_blocking(move || {
                pool.give_back(conn);
                drop(write_slot);
            });
        } else {
            pool.give_back(conn);
        }
    }
}

/// Whether a statement starts a transaction that takes the write lock at once.
fn begins_write_transaction(statement: &str) -> bool {
    let mut words = statement
        .trim_start()
        .split(|c: char| c.is_ascii_whitespace() || c == ';')
        .filter(|w| !w.is_empty());
    words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("begin"))
        && words.next().is_some_and(|w| {
            w.eq_ignore_ascii_case("immediate") || w.eq_ignore_ascii_case("exclusive")
        })
}

/// How long SQLite itself would wait for the write lock on this connection.
fn busy_timeout(conn: &Connection) -> Duration {
    let ms: i64 = conn
        .pragma_query_value(None, "busy_timeout", |row| row.get(0))
        .unwrap_or(0);
    Duration::from_millis(ms.max(0) as u64)
}

fn is_wal(conn: &Connection) -> rusqlite::Result<bool> {
    let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    Ok(mode.eq_ignore_ascii_case("wal"))
}

/// Whether a statement may set the journal mode (then WAL-ness is checked again).
fn sets_journal_mode(statement: &str) -> bool {
    let lower = statement.to_ascii_lowercase();
    lower.trim_start().starts_with("pragma") && lower.contains("journal_mode")
}

/// Whether a statement is of a kind that can run inline: a query, a plain (deferred)
/// `BEGIN`, which takes no lock, the end of a transaction that wrote nothing, or one of a
/// few pragmas that only read or set connection state. It still must turn out read-only
/// once prepared. `BEGIN IMMEDIATE`, the end of a write transaction (which syncs) and
/// everything else go to a blocking thread.
fn may_run_inline(conn: &Connection, statement: &str) -> bool {
    let mut words = statement
        .trim_start()
        .split(|c: char| c.is_ascii_whitespace() || c == ';' || c == '(')
        .filter(|w| !w.is_empty());
    let Some(first) = words.next() else {
        return false;
    };
    let is = |word: &str, keyword: &str| word.eq_ignore_ascii_case(keyword);
    if ["select", "with", "values"].iter().any(|k| is(first, k)) {
        return true;
    }
    if is(first, "begin") {
        return match words.next() {
            None => true,
            Some(w) => is(w, "deferred") || is(w, "transaction"),
        };
    }
    if ["commit", "end", "rollback"].iter().any(|k| is(first, k)) {
        let rest_is_plain = words.all(|w| is(w, "transaction"));
        return rest_is_plain
            && conn
                .transaction_state(Some(MAIN_DB))
                .is_ok_and(|state| state != TransactionState::Write);
    }
    if is(first, "pragma") {
        let name = words.next().unwrap_or("");
        let name = name.split('=').next().unwrap_or("");
        let name = name.strip_prefix("main.").unwrap_or(name);
        return ["busy_timeout", "user_version", "schema_version"]
            .iter()
            .any(|p| is(name, p));
    }
    false
}

/// Per-instance state: which databases the component may open, and what serves each label.
pub struct SqliteState {
    pub(crate) allowed: Arc<HashSet<String>>,
    pub(crate) databases: Arc<HashMap<String, DatabaseBackend>>,
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
    ) -> wasmtime::Result<Result<Resource<GuestConnection>, Error>> {
        if !self.state.allowed.contains(&database) {
            return Ok(Err(Error::AccessDenied));
        }
        let conn = match self.state.databases.get(&database) {
            None => return Ok(Err(Error::NoSuchDatabase)),
            Some(DatabaseBackend::Libsql(remote)) => GuestConnection::Libsql(remote.open()),
            Some(DatabaseBackend::Local(pool)) => GuestConnection::Local(SqliteConnection {
                pool: pool.clone(),
                conn: None,
                wal: false,
                write_slot: None,
            }),
        };
        match self.table.push(conn) {
            Ok(resource) => Ok(Ok(resource)),
            Err(e) => Ok(Err(Error::Io(format!("too many connections opened: {e}")))),
        }
    }

    async fn execute(
        &mut self,
        connection: Resource<GuestConnection>,
        statement: String,
        parameters: Vec<Value>,
    ) -> wasmtime::Result<Result<QueryResult, Error>> {
        if let GuestConnection::Libsql(remote) = self.table.get(&connection)? {
            let remote = remote.clone();
            return Ok(remote.execute(&statement, parameters).await);
        }
        let resource = local_connection(self.table, &connection)?;
        let pool = resource.pool.clone();
        if resource.conn.is_none()
            && let Some(conn) = pool.take_idle()
        {
            // Only a new connection would touch the disk; asking a pooled one its journal
            // mode does not.
            resource.wal = is_wal(&conn).unwrap_or(false);
            resource.conn = Some(conn);
        }
        if resource.write_slot.is_none() && begins_write_transaction(&statement) {
            if resource.conn.is_none() {
                match pool.take() {
                    Ok((conn, wal)) => {
                        resource.conn = Some(conn);
                        resource.wal = wal;
                    }
                    Err(e) => return Ok(Err(Error::Io(e.to_string()))),
                }
            }
            let patience = busy_timeout(resource.conn.as_ref().expect("borrowed above"));
            let queued = pool.writer.clone().acquire_owned();
            let slot = match tokio::time::timeout(patience, queued).await {
                Ok(Ok(slot)) => slot,
                // Waited as long as SQLite would have: answer as SQLite would.
                _ => return Ok(Err(Error::Io("database is locked".to_string()))),
            };
            // The guest cannot drop the resource while a call on it is running.
            local_connection(self.table, &connection)?.write_slot = Some(slot);
        }

        let resource = local_connection(self.table, &connection)?;
        if resource.wal
            && let Some(conn) = resource.conn.as_ref()
            && may_run_inline(conn, &statement)
            && let Some(result) = run_inline(conn, &statement, &parameters)
        {
            return Ok(result);
        }

        let conn = resource.conn.take().map(|conn| (conn, resource.wal));
        let write_slot = resource.write_slot.take();
        let outcome = tokio::task::spawn_blocking(move || {
            let (conn, mut wal) = match conn {
                Some(borrowed) => borrowed,
                None => match pool.take() {
                    Ok(taken) => taken,
                    Err(e) => return (None, None, Err(Error::Io(e.to_string()))),
                },
            };
            let result = run(&conn, &statement, &parameters);
            if sets_journal_mode(&statement) {
                wal = is_wal(&conn).unwrap_or(false);
            }
            // The transaction is over (committed, rolled back, or never begun): the next
            // writer may go now, without waiting for this task to be resumed.
            let write_slot = write_slot.filter(|_| !conn.is_autocommit());
            (Some((conn, wal)), write_slot, result)
        })
        .await;
        let (conn, write_slot, result) = match outcome {
            Ok(outcome) => outcome,
            Err(e) => (
                None,
                None,
                Err(Error::Io(format!("SQLite task failed: {e}"))),
            ),
        };
        let resource = local_connection(self.table, &connection)?;
        resource.write_slot = write_slot;
        if let Some((conn, wal)) = conn {
            resource.conn = Some(conn);
            resource.wal = wal;
        }
        Ok(result)
    }

    async fn drop(&mut self, connection: Resource<GuestConnection>) -> wasmtime::Result<()> {
        // `SqliteConnection`'s `Drop` returns the connection to the pool; a libSQL
        // connection's closes its stream.
        self.table.delete(connection)?;
        Ok(())
    }
}

/// A guest value bound without copying it.
struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(r) => ValueRef::Real(*r),
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
            Value::Null => ValueRef::Null,
        }))
    }
}

/// Runs one statement with positional parameters.
fn run(conn: &Connection, statement: &str, parameters: &[Value]) -> Result<QueryResult, Error> {
    let io = |e: rusqlite::Error| Error::Io(e.to_string());
    let mut stmt = conn.prepare_cached(statement).map_err(io)?;
    query(&mut stmt, parameters).map_err(io)
}

/// Runs a read-only statement on this thread within [`INLINE_BUDGET`]. `None` when it is
/// not read-only, or needs longer and was interrupted: run it on a blocking thread then.
fn run_inline(
    conn: &Connection,
    statement: &str,
    parameters: &[Value],
) -> Option<Result<QueryResult, Error>> {
    // A statement that fails to prepare is reported by the blocking run.
    let mut stmt = conn.prepare_cached(statement).ok()?;
    if !stmt.readonly() {
        return None;
    }
    INLINE_DEADLINE.set(Some(Instant::now() + INLINE_BUDGET));
    let result = query(&mut stmt, parameters);
    INLINE_DEADLINE.set(None);
    match result {
        // Interrupting a read-only statement leaves the transaction and the data as they were.
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted) => None,
        other => Some(other.map_err(|e| Error::Io(e.to_string()))),
    }
}

fn query(stmt: &mut Statement<'_>, parameters: &[Value]) -> rusqlite::Result<QueryResult> {
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let mut rows = stmt.query(rusqlite::params_from_iter(parameters.iter().map(Param)))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            values.push(match row.get_ref(i)? {
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
        let (conn, _) = pool.take().unwrap();
        run(
            &conn,
            "CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, n)",
            &[],
        )
        .unwrap();
        let inserted = run(
            &conn,
            "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
            &[
                Value::Integer(-7),
                Value::Real(1.5),
                Value::Text("héllo".into()),
                Value::Blob(vec![0, 255, 1]),
                Value::Null,
            ],
        )
        .unwrap();
        assert!(inserted.columns.is_empty() && inserted.rows.is_empty());
        let q = run(&conn, "SELECT i, r, s, b, n FROM t", &[]).unwrap();
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
    fn write_transactions_are_recognised() {
        for yes in [
            "BEGIN IMMEDIATE",
            "begin immediate transaction",
            "  BEGIN\n EXCLUSIVE;",
            "Begin Immediate;",
        ] {
            assert!(begins_write_transaction(yes), "{yes:?}");
        }
        for no in [
            "BEGIN",
            "BEGIN DEFERRED",
            "BEGIN TRANSACTION",
            "COMMIT",
            "SELECT 'BEGIN IMMEDIATE'",
            "BEGINIMMEDIATE",
            "",
        ] {
            assert!(!begins_write_transaction(no), "{no:?}");
        }
    }

    #[test]
    fn errors_carry_sqlite_messages() {
        let pool = ConnectionPool::open(&temp_db("errors")).unwrap();
        let (conn, _) = pool.take().unwrap();
        match run(&conn, "SELECT * FROM missing", &[]) {
            Err(Error::Io(m)) => assert!(m.contains("no such table"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn open_transaction_is_rolled_back_before_reuse() {
        let pool = ConnectionPool::open(&temp_db("rollback")).unwrap();
        let (conn, _) = pool.take().unwrap();
        run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        run(&conn, "BEGIN IMMEDIATE", &[]).unwrap();
        run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        assert!(!conn.is_autocommit());
        drop(SqliteConnection {
            pool: pool.clone(),
            conn: Some(conn),
            wal: false,
            write_slot: None,
        });
        assert_eq!(pool.idle_connections(), 1);
        let (conn, _) = pool.take().unwrap();
        assert!(conn.is_autocommit());
        let q = run(&conn, "SELECT count(*) FROM t", &[]).unwrap();
        assert!(matches!(q.rows[0].values[0], Value::Integer(0)));
    }

    fn integer(result: &QueryResult) -> i64 {
        match result.rows[0].values[0] {
            Value::Integer(n) => n,
            ref other => panic!("not an integer: {other:?}"),
        }
    }

    #[test]
    fn only_reads_and_ends_of_read_transactions_may_run_inline() {
        let pool = ConnectionPool::open(&temp_db("inline-kinds")).unwrap();
        let (conn, _) = pool.take().unwrap();
        for yes in [
            "SELECT 1",
            "  select * from t",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1)",
            "BEGIN",
            "BEGIN DEFERRED TRANSACTION",
            "PRAGMA busy_timeout = 5000",
            "PRAGMA user_version",
            "COMMIT",
            "END TRANSACTION",
        ] {
            assert!(may_run_inline(&conn, yes), "{yes:?}");
        }
        for no in [
            "BEGIN IMMEDIATE",
            "BEGIN EXCLUSIVE",
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET x = 1",
            "PRAGMA journal_mode = WAL",
            "PRAGMA wal_checkpoint",
            "VACUUM",
            "SAVEPOINT a",
            "",
        ] {
            assert!(!may_run_inline(&conn, no), "{no:?}");
        }
        run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        run(&conn, "BEGIN", &[]).unwrap();
        run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        // This COMMIT writes and syncs: not on the calling thread.
        assert!(!may_run_inline(&conn, "COMMIT"));
        run(&conn, "COMMIT", &[]).unwrap();
    }

    #[test]
    fn an_inline_statement_must_be_read_only() {
        let pool = ConnectionPool::open(&temp_db("inline-readonly")).unwrap();
        let (conn, _) = pool.take().unwrap();
        run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        // Looks like a query, writes: left to the blocking thread, and nothing was written.
        let sneaky = "WITH v AS (SELECT 1) INSERT INTO t SELECT * FROM v";
        assert!(run_inline(&conn, sneaky, &[]).is_none());
        let count = run_inline(&conn, "SELECT count(*) FROM t", &[])
            .unwrap()
            .unwrap();
        assert_eq!(integer(&count), 0);
    }

    #[test]
    fn a_long_read_gives_up_its_inline_turn_and_changes_nothing() {
        let pool = ConnectionPool::open(&temp_db("inline-budget")).unwrap();
        let (conn, _) = pool.take().unwrap();
        run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        run(&conn, "BEGIN IMMEDIATE", &[]).unwrap();
        run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        let long = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) \
                    SELECT count(*) FROM n";
        // Read-only, so `None` means it was interrupted.
        assert!(run_inline(&conn, long, &[]).is_none());
        // The transaction is intact and goes on.
        assert!(!conn.is_autocommit());
        let short = "SELECT count(*) FROM t";
        assert_eq!(integer(&run_inline(&conn, short, &[]).unwrap().unwrap()), 1);
        run(&conn, "COMMIT", &[]).unwrap();
        assert_eq!(integer(&run(&conn, short, &[]).unwrap()), 1);
        // Off the calling thread there is no budget.
        let bounded = long.replace("50000000", "300000");
        assert_eq!(integer(&run(&conn, &bounded, &[]).unwrap()), 300_000);
    }

    /// One guest instance's view of the SQLite interface.
    struct Guest {
        state: SqliteState,
        table: ResourceTable,
    }

    impl Guest {
        fn new(pool: &Arc<ConnectionPool>) -> Guest {
            Guest {
                state: SqliteState {
                    allowed: Arc::new([DEFAULT_DATABASE.to_string()].into_iter().collect()),
                    databases: Arc::new(
                        [(
                            DEFAULT_DATABASE.to_string(),
                            DatabaseBackend::Local(pool.clone()),
                        )]
                        .into_iter()
                        .collect(),
                    ),
                },
                table: ResourceTable::new(),
            }
        }

        async fn open(&mut self) -> Resource<GuestConnection> {
            let mut view = SqliteView {
                state: &self.state,
                table: &mut self.table,
            };
            wit::HostConnection::open(&mut view, DEFAULT_DATABASE.to_string())
                .await
                .unwrap()
                .unwrap()
        }

        async fn exec(
            &mut self,
            connection: &Resource<GuestConnection>,
            sql: &str,
        ) -> Result<QueryResult, Error> {
            let mut view = SqliteView {
                state: &self.state,
                table: &mut self.table,
            };
            let borrowed = Resource::new_borrow(connection.rep());
            wit::HostConnection::execute(&mut view, borrowed, sql.to_string(), Vec::new())
                .await
                .unwrap()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_writer_waits_for_the_first_and_sees_its_commit() {
        let pool = ConnectionPool::open(&temp_db("writer-queue")).unwrap();
        let mut first = Guest::new(&pool);
        let mut second = Guest::new(&pool);
        let a = first.open().await;
        let b = second.open().await;
        first.exec(&a, "PRAGMA journal_mode = WAL").await.unwrap();
        first.exec(&a, "CREATE TABLE t (x)").await.unwrap();
        first.exec(&a, "PRAGMA busy_timeout = 5000").await.unwrap();
        second.exec(&b, "PRAGMA busy_timeout = 5000").await.unwrap();
        first.exec(&a, "BEGIN IMMEDIATE").await.unwrap();
        first.exec(&a, "INSERT INTO t VALUES (1)").await.unwrap();
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            second.exec(&b, "BEGIN IMMEDIATE").await.unwrap();
            let waited = started.elapsed();
            // It sees the first writer's committed row.
            let seen = second.exec(&b, "SELECT count(*) FROM t").await.unwrap();
            second.exec(&b, "COMMIT").await.unwrap();
            (waited, integer(&seen))
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the second writer must wait");
        first.exec(&a, "COMMIT").await.unwrap();
        let (waited, seen) = waiting.await.unwrap();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert_eq!(seen, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_will_not_wait_is_told_the_database_is_locked() {
        let pool = ConnectionPool::open(&temp_db("writer-impatient")).unwrap();
        let mut first = Guest::new(&pool);
        let mut second = Guest::new(&pool);
        let a = first.open().await;
        let b = second.open().await;
        first.exec(&a, "CREATE TABLE t (x)").await.unwrap();
        first.exec(&a, "BEGIN IMMEDIATE").await.unwrap();
        // SQLite's own default: no busy timeout.
        second.exec(&b, "PRAGMA busy_timeout = 0").await.unwrap();
        match second.exec(&b, "BEGIN IMMEDIATE").await {
            Err(Error::Io(message)) => assert_eq!(message, "database is locked"),
            other => panic!("unexpected {other:?}"),
        }
        first.exec(&a, "ROLLBACK").await.unwrap();
        // The slot is free again once the first transaction ended.
        second.exec(&b, "BEGIN IMMEDIATE").await.unwrap();
        second.exec(&b, "COMMIT").await.unwrap();
    }
}
