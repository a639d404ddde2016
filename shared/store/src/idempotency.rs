//! Idempotency records in the key-value store: a retried POST with the same `Idempotency-Key`
//! and the same request gets the original response; the same key with a different request
//! is refused; records expire.
//!
//! Exactly once, even across crashes and concurrent duplicates: a recorded request runs in
//! one [`RequestTransaction`] that holds the database's write lock from the recall of its key
//! to the commit of its writes, and its record is written just before that commit, marked
//! with the audit event the request appended. A retry (or a duplicate sent meanwhile) waits
//! for the lock, then finds either no record, or a record whose mutation is in the database
//! (replayed), or a record whose commit never happened because the process died in between
//! (discarded: the request runs afresh).

use crate::storage::{KeyValue, Sql, SqlValue, StorageError};
use reservations_domain::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::rows::{exec, first_row};
use crate::tx::{begin_request_transaction, end_request_transaction};
use crate::{Result, Store};

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

/// The audit event a mutation appended: checked on replay to prove that the mutation whose
/// response a record holds was committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitMark {
    pub seq: i64,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    fingerprint: String,
    expires_at_ms: i64,
    response: StoredResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    commit: Option<CommitMark>,
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

/// What the key says about this request. `committed` tells whether a record's mutation is
/// in the database (see [`Store::is_committed`]); a record whose mutation is not is discarded.
pub fn recall(
    kv: &dyn KeyValue,
    caller_key_id: &str,
    idempotency_key: &str,
    request_fingerprint: &str,
    now: Timestamp,
    committed: impl FnOnce(&CommitMark) -> Result<bool>,
) -> Result<Recall> {
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
    if let Some(mark) = &record.commit
        && !committed(mark)?
    {
        kv.delete(&key)?;
        return Ok(Recall::Fresh);
    }
    if record.fingerprint == request_fingerprint {
        Ok(Recall::Replay(record.response))
    } else {
        Ok(Recall::Mismatch)
    }
}

/// Records a response; `commit` marks the audit event of the mutation it reports, if any.
pub fn remember(
    kv: &dyn KeyValue,
    caller_key_id: &str,
    idempotency_key: &str,
    request_fingerprint: &str,
    response: StoredResponse,
    commit: Option<CommitMark>,
    now: Timestamp,
) -> Result<(), StorageError> {
    let record = Record {
        fingerprint: request_fingerprint.to_owned(),
        expires_at_ms: now.timestamp_millis() + RETENTION_MS,
        response,
        commit,
    };
    let bytes = serde_json::to_vec(&record).expect("a record serializes");
    kv.set(&record_key(caller_key_id, idempotency_key), &bytes)
}

/// One write transaction around a whole recorded request; rolled back when dropped unless
/// committed.
pub struct RequestTransaction<'a> {
    db: &'a dyn Sql,
    open: bool,
}

impl RequestTransaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.open = false;
        end_request_transaction(self.db, true)
    }
}

impl Drop for RequestTransaction<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = end_request_transaction(self.db, false);
        }
    }
}

impl<'a> Store<'a> {
    /// Takes the database's write lock for the rest of a recorded request.
    pub fn begin_request_transaction(&self) -> Result<RequestTransaction<'a>> {
        begin_request_transaction(self.db())?;
        Ok(RequestTransaction {
            db: self.db(),
            open: true,
        })
    }

    /// The audit event this request appended, if any: inside the request transaction no
    /// other writer can have appended since, so it is the last one when it carries the id.
    pub fn commit_mark(&self, request_id: &str) -> Result<Option<CommitMark>> {
        let result = exec(
            self.db(),
            "SELECT seq, hash, request_id FROM audit_events ORDER BY seq DESC LIMIT 1",
            &[],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        if row.text("request_id")? != request_id {
            return Ok(None);
        }
        Ok(Some(CommitMark {
            seq: row.int("seq")?,
            hash: row.text("hash")?,
        }))
    }

    /// Whether the event a mark names is in the database, unchanged.
    pub fn is_committed(&self, mark: &CommitMark) -> Result<bool> {
        let result = exec(
            self.db(),
            "SELECT hash FROM audit_events WHERE seq = ?",
            &[SqlValue::Integer(mark.seq)],
        )?;
        match first_row(&result) {
            Some(row) => Ok(row.text("hash")? == mark.hash),
            None => Ok(false),
        }
    }
}
