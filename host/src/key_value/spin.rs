//! A key-value store in a SQLite file, as `spin up`'s default store: one table
//! `spin_key_value(store, key, value)` (in `<state-dir>/sqlite_key_value.db` for `default`),
//! so the file is interchangeable with Spin's.
//!
//! Like Spin, all instances share one connection per file, used from a blocking thread so
//! that a slow disk never stalls the HTTP workers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension};

use crate::bindings::fermyon::spin::key_value::Error;

/// A SQLite file of key-value stores.
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

    pub async fn get(
        self: &Arc<Self>,
        store: String,
        key: String,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.with_conn(move |c| {
            c.prepare_cached("SELECT value FROM spin_key_value WHERE store = ?1 AND key = ?2")?
                .query_row((&store, &key), |row| row.get::<_, Vec<u8>>(0))
                .optional()
        })
        .await
    }

    pub async fn set(
        self: &Arc<Self>,
        store: String,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), Error> {
        self.with_conn(move |c| {
            c.prepare_cached(
                "INSERT INTO spin_key_value (store, key, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (store, key) DO UPDATE SET value = excluded.value",
            )?
            .execute((&store, &key, &value))
            .map(drop)
        })
        .await
    }

    pub async fn delete(self: &Arc<Self>, store: String, key: String) -> Result<(), Error> {
        self.with_conn(move |c| {
            c.prepare_cached("DELETE FROM spin_key_value WHERE store = ?1 AND key = ?2")?
                .execute((&store, &key))
                .map(drop)
        })
        .await
    }

    pub async fn exists(self: &Arc<Self>, store: String, key: String) -> Result<bool, Error> {
        self.with_conn(move |c| {
            c.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM spin_key_value WHERE store = ?1 AND key = ?2)",
            )?
            .query_row((&store, &key), |row| row.get::<_, bool>(0))
        })
        .await
    }

    pub async fn get_keys(self: &Arc<Self>, store: String) -> Result<Vec<String>, Error> {
        self.with_conn(move |c| {
            let mut stmt = c.prepare_cached("SELECT key FROM spin_key_value WHERE store = ?1")?;
            let keys = stmt.query_map([&store], |row| row.get::<_, String>(0))?;
            keys.collect()
        })
        .await
    }

    /// Adds `delta` to the counter at `key` (absent counts as 0) and returns its new value,
    /// in one transaction. Stored as Spin's local store stores a counter: 8 little-endian
    /// bytes.
    pub async fn increment(
        self: &Arc<Self>,
        store: String,
        key: String,
        delta: i64,
    ) -> Result<i64, Error> {
        self.with_conn(move |c| {
            let tx = c.unchecked_transaction()?;
            let current: Option<Vec<u8>> = tx
                .prepare_cached("SELECT value FROM spin_key_value WHERE store = ?1 AND key = ?2")?
                .query_row((&store, &key), |row| row.get(0))
                .optional()?;
            let current = match current {
                None => 0,
                Some(bytes) => match <[u8; 8]>::try_from(bytes.as_slice()) {
                    Ok(bytes) => i64::from_le_bytes(bytes),
                    Err(_) => return Ok(Err(format!("the value at {key} is not a counter"))),
                },
            };
            let Some(value) = current.checked_add(delta) else {
                return Ok(Err(format!("the counter at {key} would overflow")));
            };
            tx.prepare_cached(
                "INSERT INTO spin_key_value (store, key, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (store, key) DO UPDATE SET value = excluded.value",
            )?
            .execute((&store, &key, value.to_le_bytes().as_slice()))?;
            tx.commit()?;
            Ok(Ok(value))
        })
        .await?
        .map_err(Error::Other)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::test_support::temp_db;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn increments_add_up_and_are_kept_as_spin_keeps_a_counter() {
        let store = Arc::new(KeyValueBackend::open(&temp_db("kv-increment")).unwrap());
        let adds: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                let delta = if i % 4 == 3 { -1 } else { 1 };
                tokio::spawn(async move {
                    store
                        .increment("default".into(), "count".into(), delta)
                        .await
                })
            })
            .collect();
        for add in adds {
            add.await.unwrap().unwrap();
        }
        let stored = store.get("default".into(), "count".into()).await.unwrap();
        assert_eq!(stored, Some(32i64.to_le_bytes().to_vec()));
        assert_eq!(
            store
                .increment("default".into(), "count".into(), 0)
                .await
                .unwrap(),
            32
        );
        // Each store has its own counters.
        assert_eq!(
            store
                .increment("other".into(), "count".into(), 5)
                .await
                .unwrap(),
            5
        );
    }

    #[tokio::test]
    async fn a_value_that_is_not_a_counter_is_not_incremented() {
        let store = Arc::new(KeyValueBackend::open(&temp_db("kv-not-a-counter")).unwrap());
        store
            .set("default".into(), "name".into(), b"gpu".to_vec())
            .await
            .unwrap();
        let refused = store
            .increment("default".into(), "name".into(), 1)
            .await
            .unwrap_err();
        assert!(
            matches!(refused, Error::Other(ref m) if m.contains("not a counter")),
            "{refused:?}"
        );
        let kept = store.get("default".into(), "name".into()).await.unwrap();
        assert_eq!(kept, Some(b"gpu".to_vec()));
    }
}
