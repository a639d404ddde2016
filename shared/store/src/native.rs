//! The storage traits over rusqlite, for tests and benchmarks that run the store natively.

use std::path::Path;

use crate::storage::{KeyValue, Sql, SqlRows, SqlValue, StorageError};
use rusqlite::types::{Value, ValueRef};

fn storage_error(e: rusqlite::Error) -> StorageError {
    StorageError::from_sqlite_message(e.to_string())
}

/// An SQLite database file (or `:memory:`), opened like Spin opens one.
pub struct NativeDb {
    connection: rusqlite::Connection,
}

impl NativeDb {
    pub fn open(path: impl AsRef<Path>) -> Result<NativeDb, StorageError> {
        let connection = rusqlite::Connection::open(path).map_err(storage_error)?;
        Ok(NativeDb { connection })
    }

    pub fn connection(&self) -> &rusqlite::Connection {
        &self.connection
    }
}

fn to_rusqlite(value: &SqlValue) -> Value {
    match value {
        SqlValue::Integer(n) => Value::Integer(*n),
        SqlValue::Real(r) => Value::Real(*r),
        SqlValue::Text(s) => Value::Text(s.clone()),
        SqlValue::Blob(b) => Value::Blob(b.clone()),
        SqlValue::Null => Value::Null,
    }
}

fn from_rusqlite(value: ValueRef<'_>) -> SqlValue {
    match value {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(n) => SqlValue::Integer(n),
        ValueRef::Real(r) => SqlValue::Real(r),
        ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
    }
}

impl Sql for NativeDb {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let mut prepared = self
            .connection
            .prepare_cached(statement)
            .map_err(storage_error)?;
        let columns: Vec<String> = prepared.column_names().map(str::to_owned).collect();
        let width = columns.len();
        let params = rusqlite::params_from_iter(params.iter().map(to_rusqlite));
        let mut cursor = prepared.query(params).map_err(storage_error)?;
        let mut rows = Vec::new();
        while let Some(row) = cursor.next().map_err(storage_error)? {
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                values.push(from_rusqlite(row.get_ref(i).map_err(storage_error)?));
            }
            rows.push(values);
        }
        Ok(SqlRows { columns, rows })
    }
}

/// A key-value store in an SQLite table, like Spin's local default store.
pub struct NativeKv {
    connection: rusqlite::Connection,
}

impl NativeKv {
    pub fn open(path: impl AsRef<Path>) -> Result<NativeKv, StorageError> {
        let connection = rusqlite::Connection::open(path).map_err(storage_error)?;
        connection
            .execute_batch(
                "PRAGMA busy_timeout = 5000;
                 CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL);",
            )
            .map_err(storage_error)?;
        Ok(NativeKv { connection })
    }
}

impl KeyValue for NativeKv {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let mut statement = self
            .connection
            .prepare_cached("SELECT value FROM kv WHERE key = ?")
            .map_err(storage_error)?;
        let mut rows = statement.query([key]).map_err(storage_error)?;
        match rows.next().map_err(storage_error)? {
            Some(row) => Ok(Some(row.get("value").map_err(storage_error)?)),
            None => Ok(None),
        }
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        self.connection
            .prepare_cached("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .and_then(|mut s| s.execute(rusqlite::params![key, value]))
            .map_err(storage_error)?;
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.connection
            .prepare_cached("DELETE FROM kv WHERE key = ?")
            .and_then(|mut s| s.execute([key]))
            .map_err(storage_error)?;
        Ok(())
    }
}

/// Writes into `db` what a build before per-node chains and need to know left (schema 8):
/// orgs `owner`, `tenant` and `buyer`; node `n1` of `owner` with unit `u0`, reserved for
/// `tenant` by `r1`; `buyer`'s spot VM `vm-1` on `u0`, terminated by a reclaim. The reclaim
/// is the one event, unkeyed (hash version 1), and shows all of itself, its reason
/// `internal: customer escalation` included, to all three orgs, as events did then.
pub fn earlier_build_with_an_unkeyed_reclaim(db: &NativeDb) -> Result<(), StorageError> {
    use sha2::{Digest, Sha256};
    crate::schema::migrate_to(db, 8).map_err(|e| StorageError::Other(e.to_string().into()))?;
    let audience = serde_json::json!(["buyer", "owner", "tenant"]);
    let content = serde_json::json!([
        1,
        "evt-1",
        5,
        "key-owner",
        "owner",
        "reservation.reclaim",
        "n1",
        "r1",
        null,
        null,
        null,
        ["u0"],
        ["vm-1"],
        [],
        "internal: customer escalation",
        "req-1",
        audience
    ]);
    let genesis = crate::audit::GENESIS_HASH;
    let hash = hex::encode(Sha256::digest(format!("{genesis}\n{content}")));
    let connection = db.connection();
    connection
        .execute_batch(
            "INSERT INTO orgs (id, name, created_at) VALUES ('owner', 'Owner', 1), \
               ('tenant', 'Tenant', 1), ('buyer', 'Buyer', 1); \
             INSERT INTO nodes (id, owner_org_id, topology_gen, unit_count, created_at, updated_at) \
               VALUES ('n1', 'owner', 1, 1, 1, 1); \
             INSERT INTO node_units (node_id, unit_id, position) VALUES ('n1', 'u0', 0); \
             INSERT INTO reservations (id, node_id, state, starts_at, ends_at, allowed_org_ids, \
               managing_org_ids, topology_gen, created_at, updated_at) \
               VALUES ('r1', 'n1', 'live', 1, NULL, '[\"tenant\"]', '[]', 1, 1, 1); \
             INSERT INTO vms (id, org_id, node_id, tier, status, created_at) \
               VALUES ('vm-1', 'buyer', 'n1', 'spot', 'terminated', 1); \
             INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at) \
               VALUES ('vm-1', 0, 'n1', 'u0', 'spot', 0, 1);",
        )
        .map_err(storage_error)?;
    connection
        .execute(
            "INSERT INTO audit_events (seq, id, at, actor_key_id, actor_org_id, action, node_id, \
               reservation_id, unit_ids, terminated, skipped, reason, request_id, visible_to, \
               vm_owners, hash_version, prev_hash, hash) \
             VALUES (1, 'evt-1', 5, 'key-owner', 'owner', 'reservation.reclaim', 'n1', 'r1', \
               '[\"u0\"]', '[\"vm-1\"]', '[]', 'internal: customer escalation', 'req-1', ?1, \
               '[]', 1, ?2, ?3)",
            rusqlite::params![audience.to_string(), genesis, hash],
        )
        .map_err(storage_error)?;
    Ok(())
}
