//! The tuned backend's scheduler: where each statement of a pooled connection runs, and in
//! which order write transactions get the database.
//!
//! A guest's `open` borrows a connection from the [`ConnectionPool`] lazily, on its first
//! statement, and dropping the resource (or the whole instance) returns it, after rolling
//! back any transaction the guest left open. A pooled connection keeps the pragmas the
//! guest set.
//!
//! Statements that may wait - for a lock, for the disk (`BEGIN IMMEDIATE`, writes,
//! `COMMIT`), or on a database not in WAL mode - run on blocking threads so a busy database
//! never stalls the HTTP workers. Reads of a WAL database wait for nobody, and most take
//! microseconds, far less than handing them to another thread and back: they run on the
//! calling worker, within [`INLINE_BUDGET`]. One that needs longer is interrupted (which
//! changes nothing, as it only reads) and run again on a blocking thread.
//!
//! Write transactions of this process queue for the database first come, first served: a
//! `BEGIN IMMEDIATE` / `BEGIN EXCLUSIVE` waits for the pool's writer slot (at most the
//! connection's `busy_timeout`, then it fails as SQLite would, with `database is locked`)
//! and holds it until the connection is back in autocommit mode. Without the queue,
//! concurrent writers poll the lock with SQLite's busy handler, whose sleeps grow to 100 ms:
//! under 32 concurrent writers a few waited over half a second while the lock was free most
//! of the time. Writers in other processes still meet SQLite's own locking.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, MAIN_DB, TransactionState};
use tokio::sync::OwnedSemaphorePermit;

use super::super::backend::BoxFuture;
use super::super::classify::{Kind, classify, sets_journal_mode};
use super::super::{Error, QueryResult, Value, file};
use super::pool::{ConnectionPool, is_wal};

/// How long a read may run on an HTTP worker before it moves to a blocking thread.
pub const INLINE_BUDGET: Duration = Duration::from_millis(1);

thread_local! {
    /// While a read runs inline on this thread: when it must give up.
    pub(super) static INLINE_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// A guest connection of the tuned backend: a pooled connection, borrowed lazily on the
/// first statement and given back when the guest drops it.
pub struct TunedConnection {
    pool: Arc<ConnectionPool>,
    conn: Option<Connection>,
    /// Whether the database was in WAL mode when the connection was borrowed (or after the
    /// guest last set the journal mode): only then do reads run inline.
    wal: bool,
    /// Held from `BEGIN IMMEDIATE` until the transaction ends.
    write_slot: Option<OwnedSemaphorePermit>,
}

impl TunedConnection {
    pub fn new(pool: Arc<ConnectionPool>) -> Self {
        Self {
            pool,
            conn: None,
            wal: false,
            write_slot: None,
        }
    }

    async fn run(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> Result<QueryResult, Error> {
        let pool = self.pool.clone();
        if self.conn.is_none()
            && let Some(conn) = pool.take_idle()
        {
            // Only a new connection would touch the disk; asking a pooled one its journal
            // mode does not.
            self.wal = is_wal(&conn).unwrap_or(false);
            self.conn = Some(conn);
        }
        if self.write_slot.is_none() && classify(&statement) == Kind::BeginWrite {
            if self.conn.is_none() {
                let (conn, wal) = pool.take().map_err(file::io_error)?;
                self.conn = Some(conn);
                self.wal = wal;
            }
            let patience = busy_timeout(self.conn.as_ref().expect("borrowed above"));
            let queued = pool.writer.clone().acquire_owned();
            self.write_slot = match tokio::time::timeout(patience, queued).await {
                Ok(Ok(slot)) => Some(slot),
                // Waited as long as SQLite would have: answer as SQLite would.
                _ => return Err(Error::Io("database is locked".to_string())),
            };
        }

        if self.wal
            && let Some(conn) = self.conn.as_ref()
            && may_run_inline(conn, &statement)
            && let Some(result) = run_inline(conn, &statement, &parameters)
        {
            return result;
        }

        let conn = self.conn.take().map(|conn| (conn, self.wal));
        let write_slot = self.write_slot.take();
        let outcome = tokio::task::spawn_blocking(move || {
            let (conn, mut wal) = match conn {
                Some(borrowed) => borrowed,
                None => match pool.take() {
                    Ok(taken) => taken,
                    Err(e) => return (None, None, Err(file::io_error(e))),
                },
            };
            let result = file::run(&conn, &statement, &parameters);
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
        self.write_slot = write_slot;
        if let Some((conn, wal)) = conn {
            self.conn = Some(conn);
            self.wal = wal;
        }
        result
    }
}

impl super::super::Connection for TunedConnection {
    fn execute(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> BoxFuture<'_, Result<QueryResult, Error>> {
        Box::pin(self.run(statement, parameters))
    }
    // Closing is dropping: `Drop` gives the connection back to the pool.
}

impl Drop for TunedConnection {
    fn drop(&mut self) {
        let write_slot = self.write_slot.take();
        let Some(conn) = self.conn.take() else {
            return;
        };
        let pool = self.pool.clone();
        if conn.is_autocommit() {
            pool.give_back(conn);
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // A rollback touches the disk: keep it off the async workers. The next writer
            // waits for it.
            handle.spawn_blocking(move || {
                pool.give_back(conn);
                drop(write_slot);
            });
        } else {
            pool.give_back(conn);
        }
    }
}

/// How long SQLite itself would wait for the write lock on this connection.
fn busy_timeout(conn: &Connection) -> Duration {
    let ms: i64 = conn
        .pragma_query_value(None, "busy_timeout", |row| row.get(0))
        .unwrap_or(0);
    Duration::from_millis(ms.max(0) as u64)
}

/// Whether a statement is of a kind that can run inline: a query, a plain (deferred)
/// `BEGIN`, which takes no lock, the end of a transaction that wrote nothing, or one of a
/// few pragmas that only read or set connection state. It still must turn out read-only
/// once prepared. `BEGIN IMMEDIATE`, the end of a write transaction (which syncs) and
/// everything else go to a blocking thread.
fn may_run_inline(conn: &Connection, statement: &str) -> bool {
    match classify(statement) {
        Kind::Query | Kind::BeginDeferred | Kind::ConnectionPragma => true,
        Kind::End => conn
            .transaction_state(Some(MAIN_DB))
            .is_ok_and(|state| state != TransactionState::Write),
        Kind::BeginWrite | Kind::Write | Kind::Other => false,
    }
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
    let result = file::query(&mut stmt, parameters);
    INLINE_DEADLINE.set(None);
    match result {
        // Interrupting a read-only statement leaves the transaction and the data as they were.
        Err(file::QueryError::Sqlite(e))
            if e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted) =>
        {
            None
        }
        other => Some(other.map_err(file::QueryError::into_guest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::Connection as _;
    use crate::sqlite::test_support::{integer, temp_db};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn open_transaction_is_rolled_back_before_reuse() {
        let pool = ConnectionPool::open(&temp_db("rollback")).unwrap();
        let (conn, _) = pool.take().unwrap();
        file::run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        file::run(&conn, "BEGIN IMMEDIATE", &[]).unwrap();
        file::run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        assert!(!conn.is_autocommit());
        let mut guest = TunedConnection::new(pool.clone());
        guest.conn = Some(conn);
        drop(guest);
        assert_eq!(pool.idle_connections(), 1);
        let (conn, _) = pool.take().unwrap();
        assert!(conn.is_autocommit());
        let q = file::run(&conn, "SELECT count(*) FROM t", &[]).unwrap();
        assert_eq!(integer(&q), 0);
    }

    #[test]
    fn only_reads_and_ends_of_read_transactions_may_run_inline() {
        let pool = ConnectionPool::open(&temp_db("inline-kinds")).unwrap();
        let (conn, _) = pool.take().unwrap();
        for yes in [
            "SELECT 1",
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
            "INSERT INTO t VALUES (1)",
            "PRAGMA journal_mode = WAL",
            "VACUUM",
            "",
        ] {
            assert!(!may_run_inline(&conn, no), "{no:?}");
        }
        file::run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        file::run(&conn, "BEGIN", &[]).unwrap();
        file::run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        // This COMMIT writes and syncs: not on the calling thread.
        assert!(!may_run_inline(&conn, "COMMIT"));
        file::run(&conn, "COMMIT", &[]).unwrap();
    }

    #[test]
    fn an_inline_statement_must_be_read_only() {
        let pool = ConnectionPool::open(&temp_db("inline-readonly")).unwrap();
        let (conn, _) = pool.take().unwrap();
        file::run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
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
        file::run(&conn, "CREATE TABLE t (x)", &[]).unwrap();
        file::run(&conn, "BEGIN IMMEDIATE", &[]).unwrap();
        file::run(&conn, "INSERT INTO t VALUES (1)", &[]).unwrap();
        let long = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) \
                    SELECT count(*) FROM n";
        // Read-only, so `None` means it was interrupted.
        assert!(run_inline(&conn, long, &[]).is_none());
        // The transaction is intact and goes on.
        assert!(!conn.is_autocommit());
        let short = "SELECT count(*) FROM t";
        assert_eq!(integer(&run_inline(&conn, short, &[]).unwrap().unwrap()), 1);
        file::run(&conn, "COMMIT", &[]).unwrap();
        assert_eq!(integer(&file::run(&conn, short, &[]).unwrap()), 1);
        // Off the calling thread there is no budget.
        let bounded = long.replace("50000000", "300000");
        assert_eq!(integer(&file::run(&conn, &bounded, &[]).unwrap()), 300_000);
    }

    async fn exec(conn: &mut TunedConnection, sql: &str) -> Result<QueryResult, Error> {
        conn.execute(sql.to_string(), Vec::new()).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_writer_waits_for_the_first_and_sees_its_commit() {
        let pool = ConnectionPool::open(&temp_db("writer-queue")).unwrap();
        let mut a = TunedConnection::new(pool.clone());
        let mut b = TunedConnection::new(pool.clone());
        exec(&mut a, "PRAGMA journal_mode = WAL").await.unwrap();
        exec(&mut a, "CREATE TABLE t (x)").await.unwrap();
        exec(&mut a, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut a, "INSERT INTO t VALUES (1)").await.unwrap();
        // Proven by the order of events, not by a duration: the second writer's BEGIN returns
        // only once the first is committing.
        let committing = Arc::new(AtomicBool::new(false));
        let waiting = tokio::spawn({
            let committing = committing.clone();
            async move {
                exec(&mut b, "BEGIN IMMEDIATE").await.unwrap();
                let began_after_commit = committing.load(Ordering::SeqCst);
                // It sees the first writer's committed row.
                let seen = exec(&mut b, "SELECT count(*) FROM t").await.unwrap();
                exec(&mut b, "COMMIT").await.unwrap();
                (began_after_commit, integer(&seen))
            }
        });
        // A head start for the second writer (if it starts late, the check is only weaker).
        tokio::time::sleep(Duration::from_millis(200)).await;
        committing.store(true, Ordering::SeqCst);
        exec(&mut a, "COMMIT").await.unwrap();
        let (began_after_commit, seen) = waiting.await.unwrap();
        assert!(
            began_after_commit,
            "the second writer began before the first committed"
        );
        assert_eq!(seen, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_will_not_wait_is_told_the_database_is_locked() {
        let pool = ConnectionPool::open(&temp_db("writer-impatient")).unwrap();
        let mut a = TunedConnection::new(pool.clone());
        let mut b = TunedConnection::new(pool.clone());
        exec(&mut a, "CREATE TABLE t (x)").await.unwrap();
        exec(&mut a, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut b, "PRAGMA busy_timeout = 0").await.unwrap();
        match exec(&mut b, "BEGIN IMMEDIATE").await {
            Err(Error::Io(message)) => assert_eq!(message, "database is locked"),
            other => panic!("unexpected {other:?}"),
        }
        exec(&mut a, "ROLLBACK").await.unwrap();
        // The slot is free again once the first transaction ended.
        exec(&mut b, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut b, "COMMIT").await.unwrap();
    }
}
