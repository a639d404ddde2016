//! What the idempotency protocol of an authenticated request (run by [`crate::execute`]) reads
//! and answers: `Idempotency-Key` read, a recorded answer replayed, a reused key refused, and
//! an answer as its record keeps it (see `reservations_store::idempotency`).

use reservations_store::idempotency::{self, StoredResponse};
use spin_sdk::http::{Request, Response};

use crate::incoming::{REQUEST_ID_HEADER, single_header};
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};
use crate::response::{Reply, json_response};

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
    pub(crate) fn text(&self) -> &str {
        match self {
            Key::Callers(key) | Key::Forwarders { key, .. } => key,
        }
    }
}

pub(crate) fn key_reused() -> Problem {
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
pub(crate) fn replay(stored: StoredResponse, request_id: &str) -> Response {
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
    outcome: Result<&Reply, &Problem>,
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
