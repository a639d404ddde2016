//! A key-value store on a Redis server: `type = "redis"` in the runtime config, as Spin's
//! `key-value-redis` does it.
//!
//! Spin's semantics, kept here: `get`/`set`/`delete`/`exists` are plain `GET`/`SET`/`DEL`/
//! `EXISTS` with no expiry, `increment` is `INCRBY`, `get-keys` is `KEYS *`, and the store's
//! name is not part of the key (every label on one server shares one keyspace). One
//! connection manager per configured store, made on first use and shared by every instance;
//! it reconnects by itself after the server restarts. Failures reach the guest as
//! `other(message)`, with the client's error in its debug form.

use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;
use tokio::sync::OnceCell;

use crate::bindings::fermyon::spin::key_value::Error;

/// How long to wait for the server to accept a connection, and for an answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One `[key_value_store.<label>]` of `type = "redis"`.
pub struct RedisStore {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
}

fn other(e: redis::RedisError) -> Error {
    Error::Other(format!("{e:?}"))
}

impl RedisStore {
    /// Checks the URL; nothing is sent yet.
    pub fn new(url: &str) -> anyhow::Result<RedisStore> {
        Ok(RedisStore {
            client: redis::Client::open(url)?,
            connection: OnceCell::new(),
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, Error> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(TIMEOUT)
            .set_response_timeout(TIMEOUT);
        self.connection
            .get_or_try_init(|| self.client.get_connection_manager_with_config(config))
            .await
            .cloned()
            .map_err(other)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.connection().await?.get(key).await.map_err(other)
    }

    pub async fn set(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        self.connection()
            .await?
            .set(key, value)
            .await
            .map_err(other)
    }

    pub async fn delete(&self, key: &str) -> Result<(), Error> {
        self.connection().await?.del(key).await.map_err(other)
    }

    pub async fn exists(&self, key: &str) -> Result<bool, Error> {
        self.connection().await?.exists(key).await.map_err(other)
    }

    /// `INCRBY`: the counter is the decimal text Redis keeps.
    pub async fn increment(&self, key: &str, delta: i64) -> Result<i64, Error> {
        self.connection()
            .await?
            .incr(key, delta)
            .await
            .map_err(other)
    }

    pub async fn get_keys(&self) -> Result<Vec<String>, Error> {
        self.connection().await?.keys("*").await.map_err(other)
    }
}
