//! The idempotency protocol: a retried POST with the same `Idempotency-Key` and the same
//! request gets the original response; the same key with a different request is refused;
//! records expire.
//!
//! Exactly once, across crashes, retries and replicas: [`Store::begin_idempotent`] takes the
//! database's write lock and looks the key up, so the original request, its retries and any
//! duplicate sent meanwhile (to any replica) take turns. A fresh key yields a [`Guard`]: the
//! request's writes join its transaction, and [`Guard::finish`] writes the record into the
//! same transaction before committing it, so the record and the writes it reports are
//! committed together or not at all. No transaction spans the key-value store, so the
//! records live in SQL, the system of record.
//!
//! A record is honoured for [`RETENTION_MS`] by the clock of the replica that asks: clocks
//! that disagree by seconds move an expiry a day away by seconds, and nothing is ordered by
//! time. Each new record sweeps up to two expired ones through an index on expiry, so storage
//! stays bounded, at O(1) per request, without a scan of all keys.

use crate::storage::SqlValue;
use reservations_domain::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::rows::first_row;
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

/// A request under an `Idempotency-Key`. Keys are scoped to the calling API key, so two
/// callers never see each other's records.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedRequest<'k> {
    pub caller_key_id: &'k str,
    pub idempotency_key: &'k str,
    /// See [`fingerprint`].
    pub fingerprint: String,
    /// When the request arrived.
    pub now: Timestamp,
}

/// What the store knows about a keyed request.
pub enum Begin<'s, 'a> {
    /// Seen with the same request: answer with the stored response.
    Replay(StoredResponse),
    /// Seen with a different request.
    Mismatch,
    /// Never seen (or expired): carry the request out under the guard.
    Fresh(Guard<'s, 'a>),
}

impl std::fmt::Debug for Begin<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Begin::Replay(stored) => f.debug_tuple("Replay").field(stored).finish(),
            Begin::Mismatch => f.write_str("Mismatch"),
            Begin::Fresh(_) => f.write_str("Fresh"),
        }
    }
}

impl<'a> Store<'a> {
    /// Takes the write lock (waiting, with back-off, while another writer holds it) and looks
    /// the key up. A replay or a mismatch releases the lock at once.
    pub fn begin_idempotent<'s>(&'s self, request: &KeyedRequest<'_>) -> Result<Begin<'s, 'a>> {
        self.db().begin_request()?;
        let guard = Guard {
            store: self,
            caller_key_id: request.caller_key_id.to_owned(),
            idempotency_key: request.idempotency_key.to_owned(),
            fingerprint: request.fingerprint.clone(),
            now_ms: request.now.timestamp_millis(),
            open: true,
        };
        let found = self.db().execute(
            "SELECT fingerprint, response FROM idempotency_records \
             WHERE caller_key_id = ? AND idempotency_key = ? AND expires_at > ?",
            &[
                SqlValue::from(request.caller_key_id),
                SqlValue::from(request.idempotency_key),
                SqlValue::Integer(request.now.timestamp_millis()),
            ],
        )?;
        let Some(row) = first_row(&found) else {
            return Ok(Begin::Fresh(guard));
        };
        let (fingerprint, response) = (row.text("fingerprint")?, row.text("response")?);
        // A record this build cannot read is treated as absent; finishing replaces it.
        let Ok(stored) = serde_json::from_str::<StoredResponse>(&response) else {
            return Ok(Begin::Fresh(guard));
        };
        drop(guard);
        if fingerprint == request.fingerprint {
            Ok(Begin::Replay(stored))
        } else {
            Ok(Begin::Mismatch)
        }
    }
}

/// A fresh keyed request in progress: holds the write lock, and the request's writes join
/// its transaction. Dropped without [`Guard::finish`], everything is rolled back and nothing
/// is recorded.
pub struct Guard<'s, 'a> {
    store: &'s Store<'a>,
    caller_key_id: String,
    idempotency_key: String,
    fingerprint: String,
    now_ms: i64,
    open: bool,
}

impl Guard<'_, '_> {
    /// Whether the database dropped this transaction (it ran too long while another writer
    /// waited, or its session expired): nothing of it can be kept, and the request may be
    /// run again from [`Store::begin_idempotent`].
    pub fn is_lost(&self) -> bool {
        self.store.db().request_state().1
    }

    /// Ends the request with the response it gave. A success is recorded and committed
    /// together with the request's writes, the record first. A refusal (4xx) is recorded
    /// without any writes. A server failure (5xx) is not recorded and its writes are rolled
    /// back, so that a retry gets another chance.
    pub fn finish(mut self, response: &StoredResponse) -> Result<()> {
        self.open = false;
        let db = self.store.db();
        if response.status >= 500 {
            return db.end_request(false);
        }
        let (effects, _) = db.request_state();
        let succeeded = (200..300).contains(&response.status);
        let record = serde_json::to_string(response).expect("a response serializes");
        let params = [
            SqlValue::from(self.caller_key_id.as_str()),
            SqlValue::from(self.idempotency_key.as_str()),
            SqlValue::from(self.fingerprint.as_str()),
            SqlValue::Text(record),
            SqlValue::Integer(self.now_ms),
            SqlValue::Integer(self.now_ms.saturating_add(RETENTION_MS)),
        ];
        let insert = "INSERT INTO idempotency_records \
             (caller_key_id, idempotency_key, fingerprint, response, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?)";
        if succeeded || !effects {
            // Under the lock the key was absent or expired, so replacing can only drop an
            // expired record.
            let recorded = db.execute(&insert.replacen("INSERT", "INSERT OR REPLACE", 1), &params);
            if let Err(e) = recorded {
                let _ = db.end_request(false);
                return Err(e.into());
            }
            return db.end_request(true);
        }
        // A refusal after some of the request's writes were kept: those go, and the record
        // is written on its own, unless another replica recorded the key meanwhile.
        db.end_request(false)?;
        db.execute(
            &format!(
                "{insert} ON CONFLICT (caller_key_id, idempotency_key) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, response = excluded.response, \
                 created_at = excluded.created_at, expires_at = excluded.expires_at \
                 WHERE idempotency_records.expires_at <= excluded.created_at"
            ),
            &params,
        )?;
        Ok(())
    }
}

impl Drop for Guard<'_, '_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.store.db().end_request(false);
        }
    }
}

/// Whether running a request again after this error may succeed (the database was busy, or
/// briefly unreachable); with [`backoff`] between the attempts.
pub fn is_transient(error: &crate::StoreError) -> bool {
    crate::tx::is_transient(error)
}

pub use crate::tx::backoff;
