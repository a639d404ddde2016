//! Writing a response: a handler's [`Reply`], or a [`Problem`], as JSON with the request id.

use serde::Serialize;
use serde_json::Value;
use spin_sdk::http::{Response, ResponseBuilder};

use crate::incoming::REQUEST_ID_HEADER;
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};

/// A successful answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
    /// A member of the body shown to this caller once and never stored, not even in an
    /// idempotency record: a replay answers without it (see [`Reply::as_recorded`]).
    pub shown_once: Option<&'static str>,
}

fn to_json(body: impl Serialize) -> Value {
    serde_json::to_value(body).expect("a response body serializes")
}

impl Reply {
    fn with_status(status: u16, body: Option<Value>) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
            shown_once: None,
        }
    }

    pub fn ok(body: impl Serialize) -> Reply {
        Reply::with_status(200, Some(to_json(body)))
    }

    pub fn created(body: impl Serialize, location: String) -> Reply {
        let mut reply = Reply::with_status(201, Some(to_json(body)));
        reply.headers.push(("location", location));
        reply
    }

    pub fn no_content() -> Reply {
        Reply::with_status(204, None)
    }

    /// Marks `member` of the body as a secret shown once (an API key's token).
    pub fn with_secret_shown_once(mut self, member: &'static str) -> Reply {
        self.shown_once = Some(member);
        self
    }

    /// The body as an idempotency record keeps it: a secret shown once is left out, and
    /// `<member>Withheld: true` says so to whoever gets the replay.
    pub(crate) fn as_recorded(&self) -> Option<String> {
        let mut body = self.body.clone()?;
        if let (Some(member), Some(object)) = (self.shown_once, body.as_object_mut())
            && object.remove(member).is_some()
        {
            object.insert(format!("{member}Withheld"), Value::Bool(true));
        }
        Some(body.to_string())
    }
}

/// A response with the headers every JSON answer carries, and `body` typed `content_type`.
pub(crate) fn json_response(
    status: u16,
    content_type: &str,
    body: Option<String>,
    request_id: &str,
) -> ResponseBuilder {
    let mut builder = Response::builder();
    builder
        .status(status)
        .header(REQUEST_ID_HEADER, request_id)
        .header("cache-control", "no-store");
    if let Some(body) = body {
        builder.header("content-type", content_type).body(body);
    }
    builder
}

pub fn problem_response(problem: &Problem, request_id: &str, instance: &str) -> Response {
    crate::request_log::problem(problem.code);
    let mut builder = json_response(
        problem.status,
        PROBLEM_CONTENT_TYPE,
        Some(problem.body(request_id, instance).to_string()),
        request_id,
    );
    for (name, value) in &problem.headers {
        builder.header(*name, value.as_str());
    }
    builder.build()
}

fn reply_response(reply: &Reply, request_id: &str) -> Response {
    let mut builder = json_response(
        reply.status,
        "application/json",
        reply.body.as_ref().map(Value::to_string),
        request_id,
    );
    for (name, value) in &reply.headers {
        builder.header(*name, value.as_str());
    }
    builder.build()
}

/// The response to a handler's outcome.
pub(crate) fn outcome_response(
    outcome: &Result<Reply, Problem>,
    request_id: &str,
    instance: &str,
) -> Response {
    match outcome {
        Ok(reply) => reply_response(reply, request_id),
        Err(problem) => problem_response(problem, request_id, instance),
    }
}
