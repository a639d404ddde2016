//! The local file run for speed rather than as Spin runs it (`--sqlite-mode tuned`): pooled
//! connections ([`pool`]), reads of a WAL database inline on the worker and a
//! first-come-first-served queue of writers ([`scheduler`]).

pub mod pool;
pub mod scheduler;

pub use pool::{ConnectionPool, TunedDatabase};
