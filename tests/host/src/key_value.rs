//! `fermyon:spin/key-value@2.0.0`, backed by SQLite like `spin up`'s default
//! store: one table `spin_key_value(store, key, value)` in
//! `<state-dir>/sqlite_key_value.db`, so the file is interchangeable with Spin's.
//!
//! Access follows Spin: a label the component did not declare in
//! `key_value_stores` is `access-denied`; a declared label that no store backs
//! is `no-such-store` (the host refuses to start with such a label, as Spin
//! does, so a guest only sees this if that check is bypassed). Without a
//! runtime config the only store is `default`, as with `spin up`; the runtime
//! config may put any label on another file or on Redis
//! ([`crate::redis_backend`]).
//!
//! Like Spin, all instances share one connection per file, used from a
//! blocking thread so that a slow disk never stalls the HTTP workers.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension};
use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::fermyon::spin::key_value::{self as wit, Error};
use crate::redis_backend::RedisStore;

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

/// The SQLite file behind the `default` store.
pub struct KeyValueBackend {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl KeyValueBackend {
    /// Opens (creating if needed) the store file and its table.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let conn = Connection::open(path)
            .map_err(|e| anyhow::anyhow!("cannot open key-value store {}: {e}", path.display()))?;
        conn.execute(
            "CREATE TABLE IF NOT EXISTS spin_key_value (
                store TEXT NOT NULL,
                key   TEXT NOT NULL,
                value BLOB NOT NULL,
                PRIMARY KEY (store, key)
            )",
            [],
        )
        .map_err(|e| anyhow::anyhow!("cannot prepare key-value store {}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn with_conn<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, Error> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = this
                .conn
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&conn)
        })
        .await
        .map_err(|e| Error::Other(format!("key-value task failed: {e}")))?
        .map_err(|e| Error::Other(e.to_string()))
    }
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
    fn store(&self, store: &Resource<KvStore>) -> wasmtime::Result<(String, StoreBackend)> {
        let store = self.table.get(store)?;
        Ok((store.label.clone(), store.backend.clone()))
    }
}

impl wit::Host for KeyValueView<'_> {}

impl wit::HostStore for KeyValueView<'_> {
    async fn open(&mut self, label: String) -> wasmtime::Result<Result<Resource<KvStore>, Error>> {
        if !self.state.allowed.contains(&label) {
            return Ok(Err(Error::AccessDenied));
        }
        let Some(backend) = self.state.stores.get(&label).cloned() else {
            return Ok(Err(Error::NoSuchStore));
        };
        match self.table.push(KvStore { label, backend }) {
            Ok(store) => Ok(Ok(store)),
            Err(_) => Ok(Err(Error::StoreTableFull)),
        }
    }

    async fn get(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, Error>> {
        let (label, backend) = self.store(&store)?;
        let local = match backend {
            StoreBackend::Redis(redis) => return Ok(redis.get(&key).await),
            StoreBackend::Local(local) => local,
        };
        Ok(local
            .with_conn(move |c| {
                c.prepare_cached("SELECT value FROM spin_key_value WHERE store = ?1 AND key = ?2")?
                    .query_row((&label, &key), |row| row.get::<_, Vec<u8>>(0))
                    .optional()
            })
            .await)
    }

    async fn set(
        &mut self,
        store: Resource<KvStore>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), Error>> {
        let (label, backend) = self.store(&store)?;
        let local = match backend {
            StoreBackend::Redis(redis) => return Ok(redis.set(&key, &value).await),
            StoreBackend::Local(local) => local,
        };
        Ok(local
            .with_conn(move |c| {
                c.prepare_cached(
                    "INSERT INTO spin_key_value (store, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (store, key) DO UPDATE SET value = excluded.value",
                )?
                .execute((&label, &key, &value))
                .map(drop)
            })
            .await)
    }

    async fn delete(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<(), Error>> {
        let (label, backend) = self.store(&store)?;
        let local = match backend {
            StoreBackend::Redis(redis) => return Ok(redis.delete(&key).await),
            StoreBackend::Local(local) => local,
        };
        Ok(local
            .with_conn(move |c| {
                c.prepare_cached("DELETE FROM spin_key_value WHERE store = ?1 AND key = ?2")?
                    .execute((&label, &key))
                    .map(drop)
            })
            .await)
    }

    async fn exists(
        &mut self,
        store: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<bool, Error>> {
        let (label, backend) = self.store(&store)?;
        let local = match backend {
            StoreBackend::Redis(redis) => return Ok(redis.exists(&key).await),
            StoreBackend::Local(local) => local,
        };
        Ok(local
            .with_conn(move |c| {
                c.prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM spin_key_value WHERE store = ?1 AND key = ?2)",
                )?
                .query_row((&label, &key), |row| row.get::<_, bool>(0))
            })
            .await)
    }

    async fn get_keys(
        &mut self,
        store: Resource<KvStore>,
    ) -> wasmtime::Result<Result<Vec<String>, Error>> {
        let (label, backend) = self.store(&store)?;
        let local = match backend {
            StoreBackend::Redis(redis) => return Ok(redis.get_keys().await),
            StoreBackend::Local(local) => local,
        };
        Ok(local
            .with_conn(move |c| {
                let mut stmt =
                    c.prepare_cached("SELECT key FROM spin_key_value WHERE store = ?1")?;
                let keys = stmt.query_map([&label], |row| row.get::<_, String>(0))?;
                keys.collect()
            })
            .await)
    }

    async fn drop(&mut self, store: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}
