//! Idempotency records in the key-value store: a retried POST with the same `Idempotency-Key`
//! and the same request gets the original response; the same key with a different request
//! is refused; records expire.

use reservations_domain::Timestamp;
use reservations_domain::storage::{KeyValue, StorageError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a record is honoured.
pub const RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The longest `Idempotency-Key` accepted.
pub const MAX_KEY_LEN: usize = 255;

/// A response as it was first given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    /// Headers of the response that describe it (e.g. `location`), replayed with it.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    fingerprint: String,
    expires_at_ms: i64,
    response: StoredResponse,
}

/// What the store knows about a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Recall {
    /// Never seen (or expired): carry out the request.
    Fresh,
    /// Seen with the same request: answer with the stored response.
    Replay(StoredResponse),
    /// Seen with a different request.
    Mismatch,
}

/// A valid key is 1–255 visible ASCII characters.
pub fn is_valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// What makes two requests "the same": method, path and body.
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update(b" ");
    hasher.update(path.as_bytes());
    hasher.update(b"\n");
    hasher.update(body);
    hex::encode(hasher.finalize())
}

/// Records are scoped to the calling API key, so two callers never see each other's.
fn record_key(caller_key_id: &str, idempotency_key: &str) -> String {
    format!("idem/{caller_key_id}/{idempotency_key}")
}

pub fn recall(
    kv: &dyn KeyValue,
    caller_key_id: &str,
    idempotency_key: &str,
    request_fingerprint: &str,
    now: Timestamp,
) -> Result<Recall, StorageError> {
    let key = record_key(caller_key_id, idempotency_key);
    let Some(bytes) = kv.get(&key)? else {
        return Ok(Recall::Fresh);
    };
    let Ok(record) = serde_json::from_slice::<Record>(&bytes) else {
        kv.delete(&key)?;
        return Ok(Recall::Fresh);
    };
    if record.expires_at_ms <= now.timestamp_millis() {
        kv.delete(&key)?;
        return Ok(Recall::Fresh);
    }
    if record.fingerprint == request_fingerprint {
        Ok(Recall::Replay(record.response))
    } else {
        Ok(Recall::Mismatch)
    }
}

pub fn remember(
    kv: &dyn KeyValue,
    caller_key_id: &str,
    idempotency_key: &str,
    request_fingerprint: &str,
    response: StoredResponse,
    now: Timestamp,
) -> Result<(), StorageError> {
    let record = Record {
        fingerprint: request_fingerprint.to_owned(),
        expires_at_ms: now.timestamp_millis() + RETENTION_MS,
        response,
    };
    let bytes = serde_json::to_vec(&record).expect("a record serializes");
    kv.set(&record_key(caller_key_id, idempotency_key), &bytes)
}
