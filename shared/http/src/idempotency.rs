//! The idempotency protocol of an authenticated request, the one place the request layer
//! meets it: `Idempotency-Key` read, a recorded answer replayed, a reused key refused, and a
//! fresh request carried out once, its answer recorded by its own write (see
//! `reservations_store::idempotency`).

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;

use reservations_store::Store;
use reservations_store::idempotency::{self, KeyedRequest, Lookup, StoredResponse};
use reservations_store::retry::KEYED_LOOKUPS;
use spin_sdk::http::{Method, Request, Response};

use crate::head::{REQUEST_ID_HEADER, RequestIds, single_header};
use crate::problem::{ALREADY_RECORDED, PROBLEM_CONTENT_TYPE, Problem};
use crate::response::{Reply, json_response, outcome_response};
use crate::routes::{Endpoint, Idempotency};

pub(crate) const REPLAY_HEADER: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if it sent a valid one.
pub(crate) fn idempotency_key(
    request: &Request,
    repeated_headers: &[&'static str],
) -> Result<Option<String>, Problem> {
    match single_header(request, repeated_headers, "idempotency-key")? {
        None => Ok(None),
        Some(key) if idempotency::is_valid_key(key) => Ok(Some(key.to_owned())),
        Some(_) => Err(Problem::bad_request(
            "invalid-idempotency-key",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )),
    }
}

/// The key a request is carried out under.
pub(crate) enum Key {
    /// The caller's `Idempotency-Key`.
    Callers(String),
    /// The key of the app that forwarded a POST its caller sent without one
    /// (docs/design.md, "Writes at home"): fresh at its first send, used for nothing else, and
    /// looked for only when the request is sent again.
    Forwarders { key: String, resent: bool },
}

impl Key {
    fn text(&self) -> &str {
        match self {
            Key::Callers(key) | Key::Forwarders { key, .. } => key,
        }
    }
}

/// The request being served.
pub(crate) struct Attempt<'r> {
    pub request: &'r Request,
    pub ids: &'r RequestIds,
    pub endpoint: Endpoint,
    pub key: Option<Key>,
    pub body: &'r [u8],
    pub now: Timestamp,
}

/// A keyed request in progress: its key, and its path (the `instance` of a problem it answers).
pub struct Recorder<'a> {
    pub(crate) keyed: KeyedRequest<'a>,
    pub(crate) instance: &'a str,
}

/// Serves the request with `handler`. A POST under an `Idempotency-Key` to an endpoint that
/// records is replayed, refused as a reuse (422), or carried out once: its answer is recorded
/// by its write (see `reservations_store::idempotency`), or, when it wrote nothing (a
/// refusal), by a statement of its own. A duplicate carried out meanwhile is found by the
/// write, which is then refused whole, and its answer replayed. With the market in cells, the
/// key is first claimed in the directory (`claims`), so that it is refused for another
/// request at home in any cell.
pub(crate) fn serve(
    store: &Store<'_>,
    claims: Option<&Store<'_>>,
    caller: &Caller,
    attempt: &Attempt<'_>,
    handler: impl Fn(Option<&Recorder<'_>>) -> Result<Reply, Problem>,
) -> Result<Response, Problem> {
    let request = attempt.request;
    let request_id = attempt.ids.server.as_str();
    let instance = request.path();
    // A key that may change nothing is refused whatever it sends: it leaves no record, so
    // read-only keys cannot fill the database with them.
    let Some(key) = attempt.key.as_ref().filter(|_| {
        attempt.endpoint.idempotency() == Idempotency::Record
            && *request.method() == Method::Post
            && caller.may_write()
    }) else {
        return Ok(outcome_response(&handler(None), request_id, instance));
    };
    let recorder = Recorder {
        keyed: KeyedRequest {
            caller_key_id: &caller.key_id,
            idempotency_key: key.text(),
            fingerprint: idempotency::fingerprint(
                &request.method().to_string(),
                &path_and_query(request),
                attempt.body,
            ),
            now: attempt.now,
        },
        instance,
    };
    let callers = matches!(key, Key::Callers(_));
    if callers
        && let Some(directory) = claims
        && !directory.claim_key(&recorder.keyed)?
    {
        return Err(key_reused());
    }
    // A forwarding app's key is fresh at its first send: there is nothing to look up.
    let fresh = matches!(key, Key::Forwarders { resent: false, .. });
    let mut attempts = 0;
    loop {
        attempts += 1;
        // Looked up again, the key was recorded by a duplicate meanwhile.
        let lookup = match fresh && attempts == 1 {
            true => Lookup::Fresh,
            false => store.look_up(&recorder.keyed)?,
        };
        match lookup {
            Lookup::Replay(stored) => return Ok(replay(stored, request_id)),
            Lookup::Mismatch => return Err(key_reused()),
            Lookup::Fresh => {}
        }
        let outcome = handler(Some(&recorder));
        match &outcome {
            Err(problem) if problem.code == ALREADY_RECORDED && attempts < KEYED_LOOKUPS => {
                continue;
            }
            // A server failure is not recorded, so that a retry gets another chance.
            Err(problem) if problem.status >= 500 => {}
            // Nor is a refusal for want of permission: a key's permissions never change, so
            // a retry is refused the same way, and a key that may not write leaves nothing.
            Err(problem) if problem.status == 403 => {}
            _ if store.answer_recorded() => {}
            // A forwarding app's key records only a write: a refusal changed nothing, and
            // sent again it is decided again.
            _ if !callers => {}
            // Nothing was written, so nothing recorded the answer: it is recorded on its own.
            // Should a duplicate have recorded the key meanwhile, its answer is the one.
            _ => {
                let response = stored(&outcome, request_id, instance);
                if !store.record_refusal(&recorder.keyed, &response)? && attempts < KEYED_LOOKUPS {
                    continue;
                }
            }
        }
        return Ok(outcome_response(&outcome, request_id, instance));
    }
}

fn key_reused() -> Problem {
    Problem::new(
        422,
        "idempotency-key-reused",
        "Idempotency-Key reused",
        "this Idempotency-Key was already used with a different request",
    )
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

/// What identifies the target of a request for idempotency, and what a forwarded one is sent
/// to: its path and query, not the full URI, whose authority names whichever replica (or
/// port, after a restart) took it.
pub(crate) fn path_and_query(request: &Request) -> String {
    match request.query() {
        "" => request.path().to_owned(),
        query => format!("{}?{query}", request.path()),
    }
}

/// What the record keeps of an answer.
pub(crate) fn stored(
    outcome: &Result<Reply, Problem>,
    request_id: &str,
    instance: &str,
) -> StoredResponse {
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
