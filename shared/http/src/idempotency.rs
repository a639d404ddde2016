//! The idempotency protocol of an authenticated request, the one place the request layer
//! meets it: `Idempotency-Key` read, a recorded answer replayed, a reused key refused, and a
//! fresh request carried out once under the store's guard (see
//! `reservations_store::idempotency`), which commits its answer's record with its writes.

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_store::idempotency::{self, Begin, KeyedRequest, StoredResponse};
use reservations_store::{StorageError, Store, StoreError};
use spin_sdk::http::{Method, Request, Response};

use crate::incoming::Arrival;
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};
use crate::request::{REQUEST_ID_HEADER, RequestIds, single_header};
use crate::response::{Reply, json_response, outcome_response};
use crate::routes::{Endpoint, Idempotency};

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

/// The request being served.
pub(crate) struct Attempt<'r> {
    pub request: &'r Request,
    pub ids: &'r RequestIds,
    pub endpoint: Endpoint,
    pub key: Option<String>,
    pub body: &'r [u8],
    pub now: Timestamp,
}

/// How often a keyed request is run when the database drops its transaction (libSQL took
/// the lock after it ran too long, the session expired) or stays busy.
const KEYED_ATTEMPTS: u32 = 4;

/// Serves the request with `handler`. A POST under an `Idempotency-Key` to an endpoint that
/// records is replayed, refused as a reuse (422), or carried out once; when the database
/// drops its transaction, nothing of it is kept and it is run again, the key looked up again
/// first, so a commit that did happen is replayed, never repeated.
pub(crate) fn serve(
    store: &Store<'_>,
    caller: &Caller,
    attempt: &Attempt<'_>,
    handler: impl Fn() -> Result<Reply, Problem>,
) -> Result<Response, Problem> {
    let request = attempt.request;
    let request_id = attempt.ids.server.as_str();
    let instance = request.path();
    let Some(key) = attempt.key.as_deref().filter(|_| {
        attempt.endpoint.idempotency == Idempotency::Record && *request.method() == Method::Post
    }) else {
        return Ok(outcome_response(&handler(), request_id, instance));
    };
    let keyed = KeyedRequest {
        caller_key_id: &caller.key_id,
        idempotency_key: key,
        fingerprint: idempotency::fingerprint(
            &request.method().to_string(),
            &path_and_query(request),
            attempt.body,
        ),
        now: attempt.now,
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let carried_out = match store.begin_idempotent(&keyed)? {
            Begin::Replay(stored) => return Ok(replay(stored, request_id)),
            Begin::Mismatch => {
                return Err(Problem::new(
                    422,
                    "idempotency-key-reused",
                    "Idempotency-Key reused",
                    "this Idempotency-Key was already used with a different request",
                ));
            }
            Begin::Fresh(guard) => {
                let outcome = handler();
                if guard.is_lost() {
                    Err(StoreError::Storage(StorageError::Busy(
                        "the request's transaction was lost".into(),
                    )))
                } else {
                    guard
                        .finish(&stored(&outcome, request_id, instance))
                        .map(|()| outcome_response(&outcome, request_id, instance))
                }
            }
        };
        match carried_out {
            Ok(response) => return Ok(response),
            Err(e) if idempotency::is_transient(&e) && attempts < KEYED_ATTEMPTS => {
                std::thread::sleep(idempotency::backoff(attempts));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The original response, request id included, so that a replayed problem's `requestId`
/// still matches its header and the audit event's. A response this very request recorded
/// (its commit answered with an error, and the run again found it) is not marked a replay.
fn replay(stored: StoredResponse, request_id: &str) -> Response {
    let StoredResponse {
        status,
        content_type,
        body,
        headers,
    } = stored;
    let original_id = headers
        .iter()
        .find(|(name, _)| name == REQUEST_ID_HEADER)
        .map_or(request_id, |(_, value)| value.as_str());
    let mut builder = json_response(status, &content_type, Some(body), original_id);
    for (name, value) in &headers {
        if name != REQUEST_ID_HEADER {
            builder.header(name.as_str(), value.as_str());
        }
    }
    if original_id != request_id {
        builder.header(REPLAY_HEADER, "true");
    }
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
