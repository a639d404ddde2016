//! The call an authenticated endpoint's handler works with, what it answers, and the strict
//! JSON body parser its inputs ([`crate::input`]) use.

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_store::cells::CellStores;
use reservations_store::{Context, Store};
use serde::de::DeserializeOwned;
use spin_sdk::http::Request;

use crate::head::RequestIds;
use crate::operation::Operation;
use crate::problem::Problem;
use crate::response::Reply;
use crate::routes::PathParams;

/// Everything a handler of an authenticated endpoint works with.
pub struct Call<'a> {
    pub request: &'a Request,
    pub(crate) params: &'a PathParams,
    pub ids: &'a RequestIds,
    pub now: Timestamp,
    /// The store of the request's home cell: the node's or VM's it is about, else the
    /// directory's (docs/design.md, "Cells").
    pub store: &'a Store<'a>,
    /// Every cell's store, for what spans cells.
    pub stores: &'a CellStores<'a>,
    pub caller: &'a Caller,
    /// The request body, read after authentication and within the endpoint's limit.
    pub(crate) body: &'a [u8],
}

/// What a handler answers: a read's reply, or the write it asks for, which the executor
/// carries out ([`crate::execute`]).
pub enum Answer {
    Reply(Reply),
    Write(Operation),
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Answer {
        Answer::Reply(reply)
    }
}

impl From<Operation> for Answer {
    fn from(operation: Operation) -> Answer {
        Answer::Write(operation)
    }
}

impl<'a> Call<'a> {
    /// Who, when and which request: what the store records with every mutation.
    pub fn context(&self) -> Context<'a> {
        Context {
            caller: self.caller,
            now: self.now,
            request_id: &self.ids.server,
            client_request_id: self.ids.client.as_deref(),
        }
    }
}

/// For an optional member of a request body, with `#[serde(default, deserialize_with =
/// "not_null")]`: absent means `None`, but an explicit `null` is refused like any other wrong
/// type (400 naming the member) — no member of the contract is nullable.
pub fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `application/json`, with parameters, in UTF-8: JSON has no other encoding (RFC 8259), so a
/// `charset` naming another one cannot be what the body is parsed as. A `+json` type says the
/// body follows some other convention (a merge patch, JSON:API, a problem document), which
/// this API does not speak: it is refused, not read as plain JSON.
fn is_json_content_type(value: &str) -> bool {
    let mut parts = value.split(';');
    let is_json = parts
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/json");
    let utf8 = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    is_json && utf8
}

/// The JSON body, parsed strictly: JSON content type (415), well-formed JSON of the right
/// shape with no unknown fields (400 naming the field).
pub(crate) fn parse_json_body<T: DeserializeOwned>(
    request: &Request,
    body: &[u8],
) -> Result<T, Problem> {
    let content_type = request
        .header("content-type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if !is_json_content_type(content_type) {
        return Err(Problem::new(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            "send the body as application/json (UTF-8)",
        ));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut *deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // serde names a missing field only in its message: `missing field `unitIds``.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .map(|name| match path.as_str() {
                "." => name.to_owned(),
                parent => format!("{parent}.{name}"),
            });
        let code = if missing.is_some() {
            "missing-field"
        } else if message.starts_with("unknown field") {
            "unknown-field"
        } else if inner.is_syntax() || inner.is_eof() {
            "malformed-json"
        } else {
            "invalid-type"
        };
        let field = missing.unwrap_or(path);
        let mut problem = Problem::bad_request(code, format!("{field}: {message}"));
        if field != "." {
            problem = problem.with("field", field);
        }
        problem
    })?;
    // One JSON value and nothing after it but whitespace: `{...}garbage` is malformed.
    deserializer.end().map_err(|e| {
        Problem::bad_request(
            "malformed-json",
            format!("trailing characters after the JSON value: {e}"),
        )
    })?;
    Ok(value)
}
