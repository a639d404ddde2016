//! The default backend of a local file: what `spin up`'s SQLite costs, statement for
//! statement, so that what the host measures is what users of Spin get.
//!
//! As in Spin's in-process SQLite: each guest `connection::open` gets a connection of its
//! own, opened on the first statement (on the calling thread) and closed when the guest drops
//! it - a transaction left open is rolled back by the close. Each statement runs on a
//! blocking thread (`spawn_blocking`). Locks are SQLite's own business: its busy handler
//! with a 5 s timeout ([`file::BUSY_TIMEOUT`]); there is no queue of writers and no read runs
//! inline. The host sets no pragma; `ATTACH` of a file is refused.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::backend::BoxFuture;
use super::{Error, QueryResult, Value, file};

/// A local database file, run as Spin runs it.
pub struct SpinLikeDatabase {
    path: PathBuf,
}

impl SpinLikeDatabase {
    /// Checks that the file can be opened (creating it if needed).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        file::open(path)
            .map_err(|e| anyhow::anyhow!("cannot open SQLite database {}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }
}

impl super::Database for SpinLikeDatabase {
    fn open(&self) -> BoxFuture<'_, Result<Box<dyn super::Connection>, Error>> {
        let conn = SpinLikeConnection {
            path: self.path.clone(),
            conn: None,
        };
        Box::pin(async move { Ok(Box::new(conn) as Box<dyn super::Connection>) })
    }
}

/// One guest connection: its own SQLite connection, opened lazily.
pub struct SpinLikeConnection {
    path: PathBuf,
    conn: Option<Connection>,
}

impl SpinLikeConnection {
    async fn run(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> Result<QueryResult, Error> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => file::open(&self.path).map_err(file::io_error)?,
        };
        let (conn, result) = tokio::task::spawn_blocking(move || {
            let result = file::run(&conn, &statement, &parameters);
            (conn, result)
        })
        .await
        .map_err(|e| Error::Io(format!("SQLite task failed: {e}")))?;
        self.conn = Some(conn);
        result
    }
}

impl super::Connection for SpinLikeConnection {
    fn execute(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> BoxFuture<'_, Result<QueryResult, Error>> {
        Box::pin(self.run(statement, parameters))
    }
    // Closing is dropping: closing the SQLite connection rolls back what the guest left open.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::Database as _;
    use crate::sqlite::test_support::{integer, temp_db};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    async fn exec(
        conn: &mut dyn super::super::Connection,
        sql: &str,
    ) -> Result<QueryResult, Error> {
        conn.execute(sql.to_string(), Vec::new()).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_open_is_a_new_connection_and_a_close_rolls_back() {
        let db = SpinLikeDatabase::open(&temp_db("spin-like")).unwrap();
        let mut first = db.open().await.unwrap();
        exec(&mut *first, "CREATE TABLE t (x)").await.unwrap();
        exec(&mut *first, "PRAGMA busy_timeout = 1").await.unwrap();
        exec(&mut *first, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut *first, "INSERT INTO t VALUES (1)").await.unwrap();
        first.close().await;
        let mut second = db.open().await.unwrap();
        // Nothing of the first connection is left: neither its pragma nor its transaction.
        let timeout = exec(&mut *second, "PRAGMA busy_timeout").await.unwrap();
        assert_eq!(integer(&timeout), 5000);
        let count = exec(&mut *second, "SELECT count(*) FROM t").await.unwrap();
        assert_eq!(integer(&count), 0);
        exec(&mut *second, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut *second, "COMMIT").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_writer_waits_in_sqlite_for_the_first() {
        let db = SpinLikeDatabase::open(&temp_db("spin-like-busy")).unwrap();
        let mut a = db.open().await.unwrap();
        let mut b = db.open().await.unwrap();
        exec(&mut *a, "PRAGMA journal_mode = WAL").await.unwrap();
        exec(&mut *a, "CREATE TABLE t (x)").await.unwrap();
        exec(&mut *a, "BEGIN IMMEDIATE").await.unwrap();
        exec(&mut *a, "INSERT INTO t VALUES (1)").await.unwrap();
        // Proven by the order of events, not by a duration: the second writer's BEGIN returns
        // only once the first is committing.
        let committing = Arc::new(AtomicBool::new(false));
        let waiting = tokio::spawn({
            let committing = committing.clone();
            async move {
                exec(&mut *b, "BEGIN IMMEDIATE").await.unwrap();
                let began_after_commit = committing.load(Ordering::SeqCst);
                let seen = exec(&mut *b, "SELECT count(*) FROM t").await.unwrap();
                exec(&mut *b, "COMMIT").await.unwrap();
                (began_after_commit, integer(&seen))
            }
        });
        // A head start for the second writer (if it starts late, the check is only weaker).
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        committing.store(true, Ordering::SeqCst);
        exec(&mut *a, "COMMIT").await.unwrap();
        let (began_after_commit, seen) = waiting.await.unwrap();
        assert!(
            began_after_commit,
            "the second writer began before the first committed"
        );
        assert_eq!(seen, 1);
    }
}
