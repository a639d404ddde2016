//! The `fermyon:spin/key-value@2.0.0` interface over its stores: a SQLite file as `spin up`'s
//! default store ([`super::spin`]) or a Redis server ([`super::redis`]).
//!
//! Access follows Spin: a label the component did not declare in
//! `key_value_stores` is `access-denied`; a declared label that no store backs
//! is `no-such-store` (the host refuses to start with such a label, as Spin
//! does, so a guest only sees this if that check is bypassed). Without a
//! runtime config the only store is `default`, as with `spin up`; the runtime
//! config may put any label on another file or on Redis.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use wasmtime::component::{HasData, Resource, ResourceTable};

use super::redis::RedisStore;
use super::spin::KeyValueBackend;
use crate::bindings::fermyon::spin::key_value::{self as wit, Error};

/// The store every app has without a runtime config.
pub const DEFAULT_STORE: &str = "default";

/// What serves one store label.
#[derive(Clone)]
pub enum StoreBackend {
    /// A SQLite file, as `spin up`'s default store.
    Local(Arc<KeyValueBackend>),
    /// A Redis server.
    Redis(Arc<RedisStore>),
}

/// An open store: the guest's `store` resource.
pub struct KvStore {
    label: String,
    backend: StoreBackend,
}

/// Per-instance state: which stores the component may open, and what serves each label.
pub struct KeyValueState {
    pub(crate) allowed: Arc<HashSet<String>>,
    pub(crate) stores: Arc<HashMap<String, StoreBackend>>,
}

/// What the generated bindings operate on.
pub struct KeyValueView<'a> {
    pub(crate) state: &'a KeyValueState,
    pub(crate) table: &'a mut ResourceTable,
}

/// [`HasData`] marker for linking the key-value interface.
pub struct KeyValue;

impl HasData for KeyValue {
    type Data<'a> = KeyValueView<'a>;
}

impl KeyValueView<'_> {
    /// The label and backend of an open store.
    pub(crate) fn backend(
        &self,
        store: &Resource<KvStore>,
    ) -> wasmtime::Result<(String, StoreBackend)> {
        let store = self.table.get(store)?;
        Ok((store.label.clone(), store.backend.clone()))
    }

    /// Opens the store `label`, under Spin's access rules.
    pub(crate) fn open_store(&mut self, label: String) -> Result<Resource<KvStore>, Error> {
        if !self.state.allowed.contains(&label) {
            return Err(Error::AccessDenied);
        }
        let Some(backend) = self.state.stores.get(&label).cloned() else {
            return Err(Error::NoSuchStore);
        };
        self.table
            .push(KvStore { label, backend })
            .map_err(|_| Error::StoreTableFull)
    }
}

impl StoreBackend {
    pub(crate) async fn get(&self, label: String, key: String) -> Result<Option<Vec<u8>>, Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.get(&key).await,
            StoreBackend::Local(local) => local.get(label, key).await,
        }
    }

    pub(crate) async fn set(
        &self,
        label: String,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.set(&key, &value).await,
            StoreBackend::Local(local) => local.set(label, key, value).await,
        }
    }

    pub(crate) async fn delete(&self, label: String, key: String) -> Result<(), Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.delete(&key).await,
            StoreBackend::Local(local) => local.delete(label, key).await,
        }
    }

    pub(crate) async fn exists(&self, label: String, key: String) -> Result<bool, Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.exists(&key).await,
            StoreBackend::Local(local) => local.exists(label, key).await,
        }
    }

    pub(crate) async fn keys(&self, label: String) -> Result<Vec<String>, Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.get_keys().await,
            StoreBackend::Local(local) => local.get_keys(label).await,
        }
    }

    pub(crate) async fn increment(
        &self,
        label: String,
        key: String,
        delta: i64,
    ) -> Result<i64, Error> {
        crate::telemetry::metrics::permit_acquired("key-value");
        match self {
            StoreBackend::Redis(redis) => redis.increment(&key, delta).await,
            StoreBackend::Local(local) => local.increment(label, key, delta).await,
        }
    }
}

impl wit::Host for KeyValueView<'_> {}

impl wit::HostStore for KeyValueView<'_> {
    #[tracing::instrument(name = "spin_key_value.open", skip_all, fields(otel.kind = "client"))]
    async fn open(&mut self, label: String) -> wasmtime::Result<Result<Resource<KvStore>, Error>> {
        Ok(self.open_store(label))
    }

    #[tracing::instrument(name = "spin_key_value.get", skip_all, fields(otel.kind = "client"))]
    async fn get(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, Error>> {
        let (label, backend) = self.backend(&store)?;
        Ok(backend.get(label, key).await)
    }

    #[tracing::instrument(name = "spin_key_value.set", skip_all, fields(otel.kind = "client"))]
    async fn set(
        &mut self,
        store: Resource<KvStore>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), Error>> {
        let (label, backend) = self.backend(&store)?;
        Ok(backend.set(label, key, value).await)
    }

    #[tracing::instrument(name = "spin_key_value.delete", skip_all, fields(otel.kind = "client"))]
    async fn delete(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<(), Error>> {
        let (label, backend) = self.backend(&store)?;
        Ok(backend.delete(label, key).await)
    }

    #[tracing::instrument(name = "spin_key_value.exists", skip_all, fields(otel.kind = "client"))]
    async fn exists(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<bool, Error>> {
        let (label, backend) = self.backend(&store)?;
        Ok(backend.exists(label, key).await)
    }

    #[tracing::instrument(name = "spin_key_value.get_keys", skip_all, fields(otel.kind = "client"))]
    async fn get_keys(
        &mut self,
        store: Resource<KvStore>,
    ) -> wasmtime::Result<Result<Vec<String>, Error>> {
        let (label, backend) = self.backend(&store)?;
        Ok(backend.keys(label).await)
    }

    async fn drop(&mut self, store: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}
