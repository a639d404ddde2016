//! The `fermyon:spin/sqlite@2.0.0` interface over the [`Database`] backends.
//!
//! Access follows Spin: a database the component did not declare in `sqlite_databases` is
//! `access-denied`; a declared one that no backend serves is `no-such-database` (the host
//! refuses to start with such a label). Errors of a backend reach the guest as they are
//! (`io(<SQLite's message>)`, e.g. `database is locked`).
//!
//! Spin's two limits hold: at most [`MAX_CONNECTIONS`] open connections per instance
//! (`io("too many connections opened")` past them), and a statement's result is refused
//! once it holds more than [`super::result::MAX_RESULT_BYTES`], as the backends collect it.
//!
//! Every statement is counted, for the request and for the host ([`super::stats`]), and so is
//! whether it ran inside a write transaction, followed per connection from the statements'
//! kinds ([`super::classify`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use wasmtime::component::{HasData, Resource, ResourceTable};

use super::backend::{Connection, Database};
use super::classify::{Kind, classify};
use super::stats::StatementCounter;
use super::{Error, QueryResult, Value, wit};

/// The most connections an instance may hold open, as Spin's SQLite factor.
pub const MAX_CONNECTIONS: usize = 256;

/// The databases of a host, by label.
pub type Databases = HashMap<String, Arc<dyn Database>>;

/// The guest's `connection` resource: a backend connection and where its transaction is.
pub struct SqliteConnection {
    conn: Box<dyn Connection>,
    transaction: Transaction,
    /// The label of its database, for the counts.
    label: String,
}

/// Where a connection's transaction is, as far as its statements tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Transaction {
    #[default]
    None,
    /// A deferred `BEGIN` that has not written yet.
    Read,
    /// Holding the write lock.
    Write,
}

impl Transaction {
    /// Moves on after a statement of `kind` that succeeded or not; returns whether the
    /// statement ran under the write lock.
    fn after(&mut self, kind: Kind, succeeded: bool) -> bool {
        let before = *self;
        match (kind, succeeded) {
            (Kind::BeginWrite, true) => *self = Transaction::Write,
            (Kind::BeginDeferred, true) => *self = Transaction::Read,
            (Kind::End, true) => *self = Transaction::None,
            (Kind::Write, true) if before == Transaction::Read => *self = Transaction::Write,
            _ => {}
        }
        before == Transaction::Write || *self == Transaction::Write
    }
}

/// Per-instance state: which databases the component may open, and where to count.
pub struct SqliteState {
    pub(crate) allowed: Arc<HashSet<String>>,
    pub(crate) databases: Arc<Databases>,
    /// This request's statements.
    pub(crate) request: Arc<StatementCounter>,
    /// The host's statements.
    pub(crate) host: Arc<StatementCounter>,
    /// This instance's open connections.
    pub(crate) open_connections: AtomicUsize,
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
    #[tracing::instrument(name = "spin_sqlite.open", skip(self),
        fields(otel.kind = "client", db.system.name = "sqlite"))]
    async fn open(
        &mut self,
        database: String,
    ) -> wasmtime::Result<Result<Resource<SqliteConnection>, Error>> {
        if !self.state.allowed.contains(&database) {
            return Ok(Err(Error::AccessDenied));
        }
        let Some(backend) = self.state.databases.get(&database) else {
            return Ok(Err(Error::NoSuchDatabase));
        };
        if self.state.open_connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            return Ok(Err(Error::Io("too many connections opened".into())));
        }
        let conn = match backend.open().await {
            Ok(conn) => conn,
            Err(e) => return Ok(Err(e)),
        };
        let resource = SqliteConnection {
            conn,
            transaction: Transaction::None,
            label: database,
        };
        match self.table.push(resource) {
            Ok(resource) => {
                self.state.open_connections.fetch_add(1, Ordering::Relaxed);
                Ok(Ok(resource))
            }
            Err(e) => Ok(Err(Error::Io(format!("too many connections opened: {e}")))),
        }
    }

    #[tracing::instrument(name = "spin_sqlite.execute", skip(self, connection, parameters),
        fields(otel.kind = "client", db.system.name = "sqlite"))]
    async fn execute(
        &mut self,
        connection: Resource<SqliteConnection>,
        query: String,
        parameters: Vec<Value>,
    ) -> wasmtime::Result<Result<QueryResult, Error>> {
        let resource = self.table.get_mut(&connection)?;
        let kind = classify(&query);
        let result = resource.conn.execute(query, parameters).await;
        let in_write_transaction = resource.transaction.after(kind, result.is_ok());
        self.state
            .request
            .record(&resource.label, in_write_transaction);
        self.state
            .host
            .record(&resource.label, in_write_transaction);
        Ok(result)
    }

    async fn drop(&mut self, connection: Resource<SqliteConnection>) -> wasmtime::Result<()> {
        let resource = self.table.delete(connection)?;
        self.state.open_connections.fetch_sub(1, Ordering::Relaxed);
        resource.conn.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_between_a_write_begin_and_its_end_are_under_the_lock() {
        let mut tx = Transaction::None;
        let steps = [
            (Kind::ConnectionPragma, true, false),
            (Kind::Query, true, false),
            (Kind::BeginWrite, true, true),
            (Kind::Query, true, true),
            (Kind::Write, false, true),
            (Kind::End, true, true),
            (Kind::Query, true, false),
            // A deferred transaction holds the lock from its first write.
            (Kind::BeginDeferred, true, false),
            (Kind::Query, true, false),
            (Kind::Write, true, true),
            (Kind::End, true, true),
            // A BEGIN IMMEDIATE that could not get the lock holds nothing.
            (Kind::BeginWrite, false, false),
            (Kind::Write, true, false),
        ];
        for (i, (kind, succeeded, under_lock)) in steps.into_iter().enumerate() {
            assert_eq!(tx.after(kind, succeeded), under_lock, "step {i}: {kind:?}");
        }
    }
}
