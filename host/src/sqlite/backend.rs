//! What the `sqlite` interface needs from a database, whatever is behind it: open a
//! connection, run one statement on it, close it. The binding ([`super::binding`]) does the
//! rest (access checks, counting); each backend is one implementation of these two traits:
//! a local file as Spin runs it ([`super::spin_like`]), a local file tuned
//! ([`super::scheduler`]), or a remote database.

use std::future::Future;
use std::pin::Pin;

use super::{Error, QueryResult, Value};

/// A future a backend returns; boxed, so the traits can be used as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One database label's backend, shared by every request.
pub trait Database: Send + Sync {
    /// A connection for one guest `connection::open`.
    fn open(&self) -> BoxFuture<'_, Result<Box<dyn Connection>, Error>>;
}

/// One guest connection.
pub trait Connection: Send {
    /// Runs one statement with positional parameters: its rows for a query, no columns and
    /// no rows otherwise. Errors reach the guest as they are (`io(<the database's message>)`).
    fn execute(
        &mut self,
        statement: String,
        parameters: Vec<Value>,
    ) -> BoxFuture<'_, Result<QueryResult, Error>>;

    /// Ends the connection when the guest drops it; a transaction left open is rolled back.
    /// A connection dropped without `close` (the guest instance ended) must do the same, so
    /// by default closing is dropping.
    fn close(self: Box<Self>) -> BoxFuture<'static, ()> {
        drop(self);
        Box::pin(async {})
    }
}
