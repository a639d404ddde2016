//! A SQLite database served by a libSQL server (sqld, Turso): `type = "libsql"` in the runtime
//! config, with the `libsql` crate's remote (Hrana over HTTP) client at the version Spin links
//! (0.5.0), so the server sees the traffic a Spin app makes.
//!
//! Spin's semantics, kept here: each guest `connection.open` gets a connection of its own (a
//! Hrana stream, one server-side SQLite connection), created lazily on its first statement;
//! every `execute` is one `query` of the client, which is one HTTP request (a Hrana cursor:
//! the statement and its rows in one round trip; later client versions first ask the server
//! to describe the statement, a second round trip Spin does not make); statements inside
//! `BEGIN … COMMIT` stay on the connection's stream, so a transaction holds; every failure
//! reaches the guest as `io(message)`, with the client's message. Dropping the connection
//! closes its stream (one more request, sent in the background), which rolls back a
//! transaction the guest left open.
//!
//! Where this host differs from Spin: a statement the server has not answered within
//! [`STATEMENT_TIMEOUT`] fails with `io(…did not answer…)` and the connection is dropped (a
//! transaction on it rolls back), so a stalled server (one that keeps its sockets and answers
//! nothing) costs a request a bounded wait. Spin's client sets no timeout: there such a
//! request waits until the server is restarted (docs/operations.md, "When a store fails").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_014::client::HttpConnector;

use crate::sqlite::result::CollectedRows;
use crate::sqlite::{BoxFuture, Connection, Database, Error, QueryResult, Value};

/// How long to wait for a TCP connection to the server before answering `io`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a statement waits for the server's answer (its rows included) before it fails.
/// Well past what a busy server takes (it refuses a write that waited 5 s for its lock).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// One `[sqlite_database.<label>]` of `type = "libsql"`.
#[derive(Debug)]
pub struct LibsqlDatabase {
    url: String,
    token: String,
}

impl LibsqlDatabase {
    /// `url` is `http://host:port` (checked by the runtime config); nothing is sent yet.
    pub fn new(url: &str, token: &str) -> LibsqlDatabase {
        LibsqlDatabase {
            url: url.to_owned(),
            token: token.to_owned(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection for one guest `open`; it reaches the server on its first statement.
    pub fn connection(&self) -> LibsqlConnection {
        LibsqlConnection {
            url: self.url.clone(),
            token: self.token.clone(),
            inner: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether the server answers a statement now (for start-up checks).
    pub async fn ping(&self) -> Result<(), String> {
        match self.connection().run("SELECT 1", Vec::new()).await {
            Ok(_) => Ok(()),
            Err(Error::Io(message)) => Err(message),
            Err(other) => Err(format!("{other:?}")),
        }
    }
}

/// The guest's connection to a libSQL database; clones share it.
#[derive(Clone)]
pub struct LibsqlConnection {
    url: String,
    token: String,
    inner: Arc<Mutex<Option<libsql::Connection>>>,
}

impl LibsqlConnection {
    async fn connection(&self) -> Result<libsql::Connection, Error> {
        if let Some(connection) = self.inner.lock().expect("not poisoned").as_ref() {
            return Ok(connection.clone());
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connection = async {
            libsql::Builder::new_remote(self.url.clone(), self.token.clone())
                .connector(http)
                .build()
                .await?
                .connect()
        }
        .await
        .map_err(|e: libsql::Error| Error::Io(format!("failed to create SQLite client: {e}")))?;
        *self.inner.lock().expect("not poisoned") = Some(connection.clone());
        Ok(connection)
    }

    /// Runs one statement with positional parameters and reads all of its rows, or fails
    /// after [`STATEMENT_TIMEOUT`] without an answer (dropping the connection).
    pub async fn run(&self, statement: &str, parameters: Vec<Value>) -> Result<QueryResult, Error> {
        match tokio::time::timeout(STATEMENT_TIMEOUT, self.run_unbounded(statement, parameters))
            .await
        {
            Ok(result) => result,
            Err(_) => {
                self.inner.lock().expect("not poisoned").take();
                Err(Error::Io(format!(
                    "the database did not answer within {}s",
                    STATEMENT_TIMEOUT.as_secs()
                )))
            }
        }
    }

    async fn run_unbounded(
        &self,
        statement: &str,
        parameters: Vec<Value>,
    ) -> Result<QueryResult, Error> {
        let connection = self.connection().await?;
        let io = |e: libsql::Error| Error::Io(e.to_string());
        let mut rows = connection
            .query(statement, to_libsql(parameters))
            .await
            .map_err(io)?;
        let count = rows.column_count();
        let columns = (0..count)
            .map(|i| rows.column_name(i).unwrap_or("").to_owned())
            .collect();
        let mut out = CollectedRows::new(columns);
        while let Some(row) = rows.next().await.map_err(io)? {
            let values = (0..count)
                .map(|i| row.get_value(i).map(from_libsql))
                .collect::<Result<Vec<_>, _>>()
                .map_err(io)?;
            out.push(values)?;
        }
        Ok(out.finish())
    }
}

impl Database for LibsqlDatabase {
    fn open(&self) -> BoxFuture<'_, Result<Box<dyn Connection>, Error>> {
        let connection: Box<dyn Connection> = Box::new(self.connection());
        Box::pin(async move { Ok(connection) })
    }
}

impl Connection for LibsqlConnection {
    fn execute(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> BoxFuture<'_, Result<QueryResult, Error>> {
        Box::pin(async move { self.run(&statement, parameters).await })
    }
    // Closing is dropping: dropping the client's connection closes its stream, which rolls
    // back a transaction the guest left open.
}

fn to_libsql(parameters: Vec<Value>) -> Vec<libsql::Value> {
    parameters
        .into_iter()
        .map(|value| match value {
            Value::Integer(i) => libsql::Value::Integer(i),
            Value::Real(r) => libsql::Value::Real(r),
            Value::Text(t) => libsql::Value::Text(t),
            Value::Blob(b) => libsql::Value::Blob(b),
            Value::Null => libsql::Value::Null,
        })
        .collect()
}

fn from_libsql(value: libsql::Value) -> Value {
    match value {
        libsql::Value::Null => Value::Null,
        libsql::Value::Integer(i) => Value::Integer(i),
        libsql::Value::Real(r) => Value::Real(r),
        libsql::Value::Text(t) => Value::Text(t),
        libsql::Value::Blob(b) => Value::Blob(b),
    }
}
