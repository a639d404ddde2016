//! The idempotency protocol: a retried POST with the same `Idempotency-Key` and the same
//! request gets the original response; the same key with a different request is refused;
//! records expire.
//!
//! Exactly once, across crashes, retries and replicas, without holding a lock: the request
//! looks its key up ([`Store::look_up`]); a fresh key is carried out, and the record of its
//! answer is written by the mutation's own write statement ([`crate::write`]), so the record
//! and the writes it reports commit together or not at all. A duplicate sent meanwhile (to
//! any replica) finds the key recorded when its own write runs: that write is refused whole
//! ([`crate::StoreError::AlreadyRecorded`]) and the duplicate looks the key up again and
//! replays the answer. A refusal, which writes nothing, is recorded by a statement of its own
//! ([`Store::record_refusal`]). No transaction spans the key-value store, so the records live
//! in SQL, the system of record.
//!
//! With the market in several cells, a request's record lives in its home cell, so a key is
//! also claimed in the directory ([`Store::claim_key`]) for the request it was first used
//! with, before anything else: used again for another request, whichever cell that one is
//! at home in, it is refused as with one cell; the same request goes on to its home cell's
//! record. A claim is never given back (a request that failed may still have taken effect),
//! and lapses with the records.
//!
//! A record is honoured for [`RETENTION_MS`] by the clock of the replica that asks: clocks
//! that disagree by seconds move an expiry a day away by seconds, and nothing is ordered by
//! time. Each new record sweeps up to two expired ones through an index on expiry, so storage
//! stays bounded, at O(1) per request, without a scan of all keys.

use crate::storage::retry_transient;
use crate::storage::{SqlValue, StorageError};
use reservations_domain::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::storage::{Row, first_row};
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
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// Seen with the same request: answer with the stored response.
    Replay(StoredResponse),
    /// Seen with a different request.
    Mismatch,
    /// Never seen (or expired): carry the request out, recording its answer with its write.
    Fresh,
}

impl Store<'_> {
    /// Looks the key up at the database this store reads: one statement, no lock.
    pub fn look_up(&self, request: &KeyedRequest<'_>) -> Result<Lookup> {
        let found = self.db().execute(
            "SELECT json_array(fingerprint, response) AS record FROM idempotency_records \
             WHERE caller_key_id = ?1 AND idempotency_key = ?2 AND expires_at > ?3",
            &lookup_params(request),
        )?;
        lookup_of(request, first_row(&found))
    }

    /// Claims the request's key for it in this database, the directory of a market in
    /// several cells: whether the key is this request's (claimed now, or by the same request
    /// before), or was claimed for another. One statement, which writes even when the key
    /// is this request's already, so that two requests claiming at once are ordered by the
    /// write lock and exactly one claim stands.
    pub fn claim_key(&self, request: &KeyedRequest<'_>) -> Result<bool> {
        let now = request.now.timestamp_millis();
        let params = [
            SqlValue::from(request.caller_key_id),
            SqlValue::from(request.idempotency_key),
            SqlValue::from(request.fingerprint.as_str()),
            SqlValue::Integer(now),
            SqlValue::Integer(now.saturating_add(RETENTION_MS)),
        ];
        // Keyed requests arriving together contend for the directory's write lock.
        let result = retry_transient(|| Ok(self.db().execute(CLAIM, &params)?))?;
        match first_row(&result) {
            Some(row) => Ok(row.int("ours")? == 1),
            None => Err(
                StorageError::Other("claiming an idempotency key answered no row".into()).into(),
            ),
        }
    }

    /// Records the answer of a keyed request that wrote nothing (a refusal, or a request that
    /// changed nothing), unless a record of the key was written meanwhile. Whether it was.
    pub fn record_refusal(
        &self,
        request: &KeyedRequest<'_>,
        response: &StoredResponse,
    ) -> Result<bool> {
        let now = request.now.timestamp_millis();
        let result = self.db().execute(
            "INSERT INTO idempotency_records \
             (caller_key_id, idempotency_key, fingerprint, response, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (caller_key_id, idempotency_key) DO UPDATE SET \
             fingerprint = excluded.fingerprint, response = excluded.response, \
             created_at = excluded.created_at, expires_at = excluded.expires_at \
             WHERE idempotency_records.expires_at <= excluded.created_at \
             RETURNING 1 AS recorded",
            &[
                SqlValue::from(request.caller_key_id),
                SqlValue::from(request.idempotency_key),
                SqlValue::from(request.fingerprint.as_str()),
                SqlValue::Text(serde_json::to_string(response).expect("a response serializes")),
                SqlValue::Integer(now),
                SqlValue::Integer(now.saturating_add(RETENTION_MS)),
            ],
        )?;
        Ok(!result.rows.is_empty())
    }
}

/// Claims a key, or keeps the claim that stands (unless it lapsed), and says whose it is.
const CLAIM: &str = "INSERT INTO idempotency_claims \
     (caller_key_id, idempotency_key, fingerprint, created_at, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (caller_key_id, idempotency_key) DO UPDATE SET \
     fingerprint = iif(idempotency_claims.expires_at <= excluded.created_at, excluded.fingerprint, fingerprint), \
     created_at = iif(idempotency_claims.expires_at <= excluded.created_at, excluded.created_at, created_at), \
     expires_at = iif(idempotency_claims.expires_at <= excluded.created_at, excluded.expires_at, expires_at) \
     RETURNING fingerprint = ?3 AS ours";

fn lookup_params(request: &KeyedRequest<'_>) -> [SqlValue; 3] {
    [
        SqlValue::from(request.caller_key_id),
        SqlValue::from(request.idempotency_key),
        SqlValue::Integer(request.now.timestamp_millis()),
    ]
}

/// What the record found (a row whose `record` is `[fingerprint, response]`, or none, or a
/// row with none) says of the request.
fn lookup_of(request: &KeyedRequest<'_>, found: Option<Row<'_>>) -> Result<Lookup> {
    let Some((fingerprint, response)) = found
        .map(|row| row.opt_json::<(String, String)>("record"))
        .transpose()?
        .flatten()
    else {
        return Ok(Lookup::Fresh);
    };
    // A record this build cannot read is treated as absent; the request's write replaces it.
    let Ok(stored) = serde_json::from_str::<StoredResponse>(&response) else {
        return Ok(Lookup::Fresh);
    };
    Ok(if fingerprint == request.fingerprint {
        Lookup::Replay(stored)
    } else {
        Lookup::Mismatch
    })
}
