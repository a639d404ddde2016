//! `fermyon:spin/key-value@2.0.0`: the WIT binding ([`binding`]) over the stores Spin offers,
//! a SQLite file as `spin up`'s default ([`spin`]) and Redis ([`redis`]).

pub mod binding;
pub mod redis;
pub mod spin;

pub use binding::{DEFAULT_STORE, KeyValue, KeyValueState, KeyValueView, KvStore, StoreBackend};
pub use spin::KeyValueBackend;
