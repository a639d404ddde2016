//! `fermyon:spin/key-value@2.0.0` ([`binding`]) and `wasi:keyvalue`'s store and atomic counters
//! ([`wasi`]) over the stores Spin offers, a SQLite file as `spin up`'s default ([`spin`]) and
//! Redis ([`redis`]).

pub mod binding;
pub mod redis;
pub mod spin;
pub mod wasi;

pub use binding::{DEFAULT_STORE, KeyValue, KeyValueState, KeyValueView, KvStore, StoreBackend};
pub use spin::KeyValueBackend;
