//! The idempotency protocol of an authenticated request, the one place the request layer
//! meets it: `Idempotency-Key` read, a recorded answer replayed, a reused key refused, and a
//! fresh request's answer recorded in the order that makes a retry safe.

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_store::Store;
use reservations_store::idempotency::{self, Recall, RequestTransaction, StoredResponse};
use spin_sdk::http::{Method, Request, Response};

use crate::incoming::Arrival;
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};
use crate::request::{REQUEST_ID_HEADER, RequestIds, single_header};
use crate::response::{Reply, json_response};
use crate::routes::{Endpoint, Idempotency};
use crate::spin_store::SpinKv;

const REPLAY_HEADER: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if it sent a valid one.
pub(crate) fn idempotency_key(
    request: &Request,
    arrival: &Arrival,
) -> Result<Option<String>, Problem> {
    match single_header(request, arrival, "idempotency-key")? {
        None => Ok(None),
        Some(key) if idempotency::is_valid_key(key) => Ok(Some(key.to_owned())),
        Some(_) => Err(Problem::bad_request(
            "invalid-idempotency-key",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )),
    }
}

/// What to do with a request before its handler runs.
pub(crate) enum Start<'s> {
    /// Answer with this: the recorded response to the key's first request.
    Replay(Response),
    /// Carry it out; with a recording, its answer is recorded under the key.
    Proceed(Option<Recording<'s>>),
}

/// A fresh request whose answer is to be recorded, inside its request transaction.
pub(crate) struct Recording<'s> {
    kv: SpinKv,
    key: String,
    fingerprint: String,
    transaction: RequestTransaction<'s>,
    now: Timestamp,
}

/// The request being served.
pub(crate) struct Attempt<'r> {
    pub request: &'r Request,
    pub ids: &'r RequestIds,
    pub endpoint: Endpoint,
    pub key: Option<String>,
    pub body: &'r [u8],
    pub now: Timestamp,
}

/// Looks the key up: a replay, a mismatch (422), or a fresh request to record. Only POSTs of
/// endpoints that record are recorded.
pub(crate) fn start<'s>(
    store: &Store<'s>,
    caller: &Caller,
    attempt: &Attempt<'_>,
) -> Result<Start<'s>, Problem> {
    let request = attempt.request;
    let Some(key) = attempt.key.clone().filter(|_| {
        attempt.endpoint.idempotency == Idempotency::Record && *request.method() == Method::Post
    }) else {
        return Ok(Start::Proceed(None));
    };
    let kv = SpinKv::open_default()?;
    let fingerprint = idempotency::fingerprint(
        &request.method().to_string(),
        &path_and_query(request),
        attempt.body,
    );
    // The write lock first: the original request, its retries and any duplicate sent
    // meanwhile take turns, and each finds the record of the one before it complete.
    let transaction = store.begin_request_transaction()?;
    let recall = idempotency::recall(
        &kv,
        &caller.key_id,
        &key,
        &fingerprint,
        attempt.now,
        |mark| store.is_committed(mark),
    )?;
    match recall {
        Recall::Replay(stored) => Ok(Start::Replay(replay(stored, &attempt.ids.server))),
        Recall::Mismatch => Err(Problem::new(
            422,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was already used with a different request",
        )),
        Recall::Fresh => Ok(Start::Proceed(Some(Recording {
            kv,
            key,
            fingerprint,
            transaction,
            now: attempt.now,
        }))),
    }
}

/// The original response, request id included, so that a replayed problem's `requestId`
/// still matches its header and the audit event's.
fn replay(stored: StoredResponse, fallback_request_id: &str) -> Response {
    let StoredResponse {
        status,
        content_type,
        body,
        headers,
    } = stored;
    let original_id = headers
        .iter()
        .find(|(name, _)| name == REQUEST_ID_HEADER)
        .map_or(fallback_request_id, |(_, value)| value.as_str());
    let mut builder = json_response(status, &content_type, Some(body), original_id);
    for (name, value) in &headers {
        if name != REQUEST_ID_HEADER {
            builder.header(name.as_str(), value.as_str());
        }
    }
    builder.header(REPLAY_HEADER, "true");
    builder.build()
}

/// What identifies the target of a request for idempotency: its path and query, not the
/// full URI, whose authority names whichever replica (or port, after a restart) took it.
fn path_and_query(request: &Request) -> String {
    match request.query() {
        "" => request.path().to_owned(),
        query => format!("{}?{query}", request.path()),
    }
}

/// What the record keeps of an answer.
fn stored(outcome: &Result<Reply, Problem>, request_id: &str, instance: &str) -> StoredResponse {
    let mut headers = vec![(REQUEST_ID_HEADER.to_owned(), request_id.to_owned())];
    match outcome {
        Ok(reply) => {
            headers.extend(
                reply
                    .headers
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), value.clone())),
            );
            StoredResponse {
                status: reply.status,
                content_type: "application/json".to_owned(),
                body: reply.as_recorded().unwrap_or_default(),
                headers,
            }
        }
        Err(problem) => StoredResponse {
            status: problem.status,
            content_type: PROBLEM_CONTENT_TYPE.to_owned(),
            body: problem.body(request_id, instance).to_string(),
            headers,
        },
    }
}

impl Recording<'_> {
    /// Records the answer and ends the request transaction. Server-side failures are not
    /// recorded (a retry should get another chance), and what they wrote is rolled back
    /// with the transaction.
    pub(crate) fn finish(
        self,
        store: &Store<'_>,
        caller: &Caller,
        outcome: &Result<Reply, Problem>,
        request_id: &str,
        instance: &str,
    ) -> Result<(), Problem> {
        let stored = stored(outcome, request_id, instance);
        let status = stored.status;
        if status >= 500 {
            return Ok(());
        }
        let Recording {
            kv,
            key,
            fingerprint,
            transaction,
            now,
        } = self;
        let remember = |commit| {
            idempotency::remember(&kv, &caller.key_id, &key, &fingerprint, stored, commit, now)
        };
        let succeeded = (200..300).contains(&status);
        match store.commit_mark(request_id)? {
            // The record goes first, marked with the event that proves the commit: without
            // it, a retry would carry the mutation out a second time.
            Some(mark) if succeeded => {
                remember(Some(mark))?;
                transaction.commit()?;
            }
            // Nothing could prove a commit of this answer, so it is recorded only after one.
            _ => {
                if succeeded {
                    transaction.commit()?;
                }
                if let Err(e) = remember(None) {
                    eprintln!("could not record idempotency key: {e}");
                }
            }
        }
        Ok(())
    }
}
