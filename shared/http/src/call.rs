//! One request's life in a component: request id, store, authentication, idempotency,
//! body and query parsing, and the response — with every failure rendered as a problem.

use chrono::Utc;
use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_domain::ids::is_valid_id;
use reservations_domain::storage::StorageError;
use reservations_store::idempotency::{self, Begin, KeyedRequest, StoredResponse};
use reservations_store::{Context, Store, StoreError};
use serde::de::DeserializeOwned;
use serde_json::Value;
use spin_sdk::http::{Method, Params, Request, Response, Router};

use crate::auth::{authenticate, bearer_token};
use crate::incoming::{Arrival, take_arrival};
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};
use crate::spin_store::SpinDb;

/// The default largest request body, in bytes.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;
/// Bodies that may carry a whole node's unit list.
pub const LARGE_MAX_BODY: usize = 8 * 1024 * 1024;

const REQUEST_ID_HEADER: &str = "x-request-id";
const REPLAY_HEADER: &str = "idempotent-replayed";

/// How an endpoint treats `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// A mutation: the first response is recorded and replayed for retries.
    Record,
    /// Reads and dry runs: the header is accepted and validated, nothing is recorded, so a
    /// later call always reflects the current state.
    Ignore,
}

/// What an endpoint needs from the request machinery.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    pub idempotency: Idempotency,
    pub max_body: usize,
}

impl Endpoint {
    pub const READ: Endpoint = Endpoint {
        idempotency: Idempotency::Ignore,
        max_body: DEFAULT_MAX_BODY,
    };
    pub const WRITE: Endpoint = Endpoint {
        idempotency: Idempotency::Record,
        max_body: DEFAULT_MAX_BODY,
    };
    pub const LARGE_WRITE: Endpoint = Endpoint {
        idempotency: Idempotency::Record,
        max_body: LARGE_MAX_BODY,
    };
    pub const DRY_RUN: Endpoint = Endpoint {
        idempotency: Idempotency::Ignore,
        max_body: DEFAULT_MAX_BODY,
    };
}

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

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply {
            status: 200,
            body: Some(body),
            headers: Vec::new(),
            shown_once: None,
        }
    }

    pub fn created(body: Value, location: String) -> Reply {
        Reply {
            status: 201,
            body: Some(body),
            headers: vec![("location", location)],
            shown_once: None,
        }
    }

    pub fn no_content() -> Reply {
        Reply {
            status: 204,
            body: None,
            headers: Vec::new(),
            shown_once: None,
        }
    }

    /// Marks `member` of the body as a secret shown once (an API key's token).
    pub fn with_secret_shown_once(mut self, member: &'static str) -> Reply {
        self.shown_once = Some(member);
        self
    }

    /// The body as an idempotency record keeps it: a secret shown once is left out, and
    /// `<member>Withheld: true` says so to whoever gets the replay.
    fn as_recorded(&self) -> Option<String> {
        let mut body = self.body.clone()?;
        if let (Some(member), Some(object)) = (self.shown_once, body.as_object_mut())
            && object.remove(member).is_some()
        {
            object.insert(format!("{member}Withheld"), Value::Bool(true));
        }
        Some(body.to_string())
    }
}

/// Everything a handler works with.
pub struct Call<'a> {
    pub request: &'a Request,
    pub params: &'a Params,
    pub ids: &'a RequestIds,
    pub now: Timestamp,
    pub store: &'a Store<'a>,
    pub caller: &'a Caller,
    /// The request body, read after authentication and within the endpoint's limit.
    body: &'a [u8],
}

/// A request's ids: the server's own, and the one the client sent (kept beside it, never
/// instead of it: two callers could send the same one).
#[derive(Debug, Clone)]
pub struct RequestIds {
    pub server: String,
    pub client: Option<String>,
}

impl RequestIds {
    fn of(request: &Request) -> RequestIds {
        RequestIds {
            server: fresh_request_id(),
            client: request
                .header(REQUEST_ID_HEADER)
                .and_then(|v| v.as_str())
                .filter(|id| {
                    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
                })
                .map(str::to_owned),
        }
    }
}

/// A new server request id.
pub fn fresh_request_id() -> String {
    format!("req-{}", crate::auth::random_hex(12))
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

    /// A path parameter that must be a valid id; anything else cannot name an object, so it
    /// is answered like a missing one.
    pub fn path_id(&self, name: &str, what: &str) -> Result<&'a str, Problem> {
        let value = self.params.get(name).unwrap_or_default();
        if is_valid_id(value) {
            Ok(value)
        } else {
            Err(Problem::not_found(format!("{what} not found")))
        }
    }

    /// The JSON body, parsed strictly: JSON content type (415), size limit (413), well-formed
    /// JSON of the right shape with no unknown fields (400 naming the field).
    pub fn json_body<T: DeserializeOwned>(&self) -> Result<T, Problem> {
        parse_json_body(self.request, self.body)
    }

    /// Like [`Call::json_body`], but an absent body means the default.
    pub fn optional_json_body<T: DeserializeOwned + Default>(&self) -> Result<T, Problem> {
        if self.body.is_empty() && self.request.header("content-type").is_none() {
            return Ok(T::default());
        }
        self.json_body()
    }

    /// The query string as decoded pairs; any parameter not in `allowed` is a 400.
    pub fn query(&self, allowed: &[&str]) -> Result<Vec<(String, String)>, Problem> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(self.request.query().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if let Some((unknown, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            return Err(Problem::bad_request(
                "unknown-parameter",
                format!(
                    "unknown query parameter {unknown:?}; allowed: {}",
                    allowed.join(", ")
                ),
            )
            .with("parameter", unknown.clone()));
        }
        Ok(pairs)
    }
}

/// Finds the single value of a query parameter.
pub fn single<'q>(pairs: &'q [(String, String)], name: &str) -> Result<Option<&'q str>, Problem> {
    let mut values = pairs
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str());
    let first = values.next();
    if values.next().is_some() {
        return Err(Problem::bad_request(
            "repeated-parameter",
            format!("query parameter {name:?} may appear once"),
        )
        .with("parameter", name));
    }
    Ok(first)
}

/// The `limit` query parameter: 1..=max, default `default`.
pub fn page_limit(
    pairs: &[(String, String)],
    default: usize,
    max: usize,
) -> Result<usize, Problem> {
    match single(pairs, "limit")? {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(Problem::bad_request(
                "invalid-parameter",
                format!("limit must be an integer from 1 to {max}"),
            )
            .with("parameter", "limit")),
        },
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

/// `application/json` or `application/*+json`, in UTF-8: JSON has no other encoding (RFC
/// 8259), so a `charset` naming another one cannot be what the body is parsed as.
fn is_json_content_type(value: &str) -> bool {
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let is_json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    let utf8 = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    is_json && utf8
}

fn parse_json_body<T: DeserializeOwned>(request: &Request, body: &[u8]) -> Result<T, Problem> {
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

/// What identifies the target of a request for idempotency: its path and query, not the
/// full URI, whose authority names whichever replica (or port, after a restart) took it.
fn path_and_query(request: &Request) -> String {
    match request.query() {
        "" => request.path().to_owned(),
        query => format!("{}?{query}", request.path()),
    }
}

fn json_response(
    status: u16,
    content_type: &str,
    body: Option<String>,
    request_id: &str,
) -> spin_sdk::http::ResponseBuilder {
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

/// Serves an authenticated endpoint.
pub fn endpoint(
    request: Request,
    params: Params,
    options: Endpoint,
    handler: impl Fn(&Call<'_>) -> Result<Reply, Problem>,
) -> Response {
    let ids = RequestIds::of(&request);
    let instance = request.path().to_owned();
    match serve(&request, &params, options, &ids, handler) {
        Ok(response) => response,
        Err(problem) => problem_response(&problem, &ids.server, &instance),
    }
}

/// The app's settings, from its variables.
pub struct AppConfig {
    operator_token: String,
    /// Keys the audit chain's hashes.
    audit_key: String,
    /// How long a request body may take to arrive.
    body_deadline_ms: u64,
}

impl AppConfig {
    /// The settings, or the 503 problem every authenticated route (and health) answers
    /// while a secret the app needs is empty.
    pub fn read() -> Result<AppConfig, Problem> {
        let unset = |variable: &str, code: &'static str| {
            Problem::new(
                503,
                code,
                "Service not configured",
                format!(
                    "the {variable} variable is not set (SPIN_VARIABLE_{}); authenticated routes are refused until it is",
                    variable.to_ascii_uppercase()
                ),
            )
        };
        let secret = |variable: &str, code| match spin_sdk::variables::get(variable) {
            Ok(value) if !value.trim().is_empty() => Ok(value),
            _ => Err(unset(variable, code)),
        };
        Ok(AppConfig {
            operator_token: secret("operator_token", "operator-token-unset")?,
            audit_key: secret("audit_key", "audit-key-unset")?,
            body_deadline_ms: spin_sdk::variables::get("body_deadline_ms")
                .ok()
                .and_then(|value| value.parse().ok())
                .unwrap_or(DEFAULT_BODY_DEADLINE_MS),
        })
    }
}

/// How long a request body may take to arrive unless `body_deadline_ms` says otherwise.
pub const DEFAULT_BODY_DEADLINE_MS: u64 = 10_000;

/// The one value of a header that may appear once; a repeated one is a 400.
fn single_header<'r>(
    request: &'r Request,
    arrival: &Arrival,
    name: &'static str,
) -> Result<Option<&'r str>, Problem> {
    if arrival.repeated_headers.contains(&name) {
        return Err(Problem::bad_request(
            "repeated-header",
            format!("the {name} header may appear once"),
        )
        .with("header", name));
    }
    Ok(request.header(name).map(|v| v.as_str().unwrap_or("\u{0}")))
}

/// A declared body longer than the endpoint takes is refused before any of it is read.
fn refuse_declared_oversize(request: &Request, max_body: usize) -> Result<(), Problem> {
    let declared = request
        .header("content-length")
        .and_then(|v| v.as_str())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(length) if length > max_body as u64 => {
            Err(Problem::payload_too_large(max_body, Some(length)))
        }
        _ => Ok(()),
    }
}

/// How often a keyed request is run when its transaction is lost to the database (libSQL
/// took the lock after it ran too long, the session expired) or the database is busy.
const KEYED_ATTEMPTS: u32 = 4;

fn serve(
    request: &Request,
    params: &Params,
    options: Endpoint,
    ids: &RequestIds,
    handler: impl Fn(&Call<'_>) -> Result<Reply, Problem>,
) -> Result<Response, Problem> {
    let mut arrival = take_arrival();
    refuse_declared_oversize(request, options.max_body)?;
    for name in ["content-type", "content-length", "x-request-id"] {
        single_header(request, &arrival, name)?;
    }
    let config = AppConfig::read()?;
    let token = bearer_token(single_header(request, &arrival, "authorization")?)?;
    let db = SpinDb::open_default()?;
    let store = Store::keyed(&db, config.audit_key.as_bytes())?;
    let caller = authenticate(&store, token, &config.operator_token)?;
    // Only now, for a known caller, is the body read: within the endpoint's limit and the
    // deadline, so no stranger can make the server hold bytes or wait.
    let body = arrival.read_body(options.max_body, config.body_deadline_ms)?;
    let idempotency_key = match single_header(request, &arrival, "idempotency-key")? {
        None => None,
        Some(key) if idempotency::is_valid_key(key) => Some(key.to_owned()),
        Some(_) => {
            return Err(Problem::bad_request(
                "invalid-idempotency-key",
                "Idempotency-Key must be 1-255 visible ASCII characters",
            ));
        }
    };
    let call = Call {
        request,
        params,
        ids,
        now: Utc::now(),
        store: &store,
        caller: &caller,
        body: &body,
    };
    match (&idempotency_key, options.idempotency, request.method()) {
        (Some(key), Idempotency::Record, Method::Post) => {
            let keyed = KeyedRequest {
                caller_key_id: &caller.key_id,
                idempotency_key: key,
                fingerprint: idempotency::fingerprint(
                    &request.method().to_string(),
                    &path_and_query(request),
                    &body,
                ),
                now: call.now,
            };
            serve_keyed(&call, &keyed, &handler)
        }
        _ => Ok(answer(&call, handler(&call)).response),
    }
}

/// A handler's outcome as the caller gets it, and as an idempotency record keeps it.
struct Answer {
    response: Response,
    recorded: StoredResponse,
}

fn answer(call: &Call<'_>, outcome: Result<Reply, Problem>) -> Answer {
    let request_id = call.ids.server.as_str();
    let mut headers = vec![(REQUEST_ID_HEADER.to_owned(), request_id.to_owned())];
    let (status, content_type, body, response) = match outcome {
        Ok(reply) => {
            headers.extend(
                reply
                    .headers
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), value.clone())),
            );
            (
                reply.status,
                "application/json",
                reply.as_recorded(),
                reply_response(&reply, request_id),
            )
        }
        Err(problem) => {
            let path = call.request.path();
            (
                problem.status,
                PROBLEM_CONTENT_TYPE,
                Some(problem.body(request_id, path).to_string()),
                problem_response(&problem, request_id, path),
            )
        }
    };
    Answer {
        response,
        recorded: StoredResponse {
            status,
            content_type: content_type.to_owned(),
            body: body.unwrap_or_default(),
            headers,
        },
    }
}

/// A POST under an `Idempotency-Key`: replayed, refused as a reuse, or carried out once
/// under the store's guard (see `reservations_store::idempotency`). When the database drops
/// the request's transaction, nothing of it is kept and the request is run again: the key
/// is looked up again first, so a commit that did happen is replayed, never repeated.
fn serve_keyed(
    call: &Call<'_>,
    keyed: &KeyedRequest<'_>,
    handler: &impl Fn(&Call<'_>) -> Result<Reply, Problem>,
) -> Result<Response, Problem> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let outcome = match call.store.begin_idempotent(keyed) {
            Ok(Begin::Replay(stored)) => return Ok(replay(call, stored)),
            Ok(Begin::Mismatch) => {
                return Err(Problem::new(
                    422,
                    "idempotency-key-reused",
                    "Idempotency-Key reused",
                    "this Idempotency-Key was already used with a different request",
                ));
            }
            Ok(Begin::Fresh(guard)) => {
                let outcome = handler(call);
                if guard.is_lost() {
                    Err(StoreError::Storage(StorageError::Busy(
                        "the request's transaction was lost".into(),
                    )))
                } else {
                    let answer = answer(call, outcome);
                    guard.finish(&answer.recorded).map(|()| answer.response)
                }
            }
            // Taking the lock was already tried again while the database was busy.
            Err(e) => return Err(e.into()),
        };
        match outcome {
            Ok(response) => return Ok(response),
            Err(e) if idempotency::is_transient(&e) && attempts < KEYED_ATTEMPTS => {
                std::thread::sleep(idempotency::backoff(attempts));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The original response, request id included, so that a replayed problem's `requestId`
/// still matches its header and the audit event's. A response this very request recorded (its
/// commit answered with an error, and the run again found it) is not marked as a replay.
fn replay(call: &Call<'_>, stored: StoredResponse) -> Response {
    let original_id = stored
        .headers
        .iter()
        .find(|(name, _)| name == REQUEST_ID_HEADER)
        .map_or(call.ids.server.as_str(), |(_, value)| value.as_str());
    let is_own = original_id == call.ids.server;
    let mut builder = json_response(
        stored.status,
        &stored.content_type,
        Some(stored.body.clone()),
        original_id,
    );
    for (name, value) in &stored.headers {
        if name != REQUEST_ID_HEADER {
            builder.header(name.as_str(), value.as_str());
        }
    }
    if !is_own {
        builder.header(REPLAY_HEADER, "true");
    }
    builder.build()
}

/// Serves a public endpoint (no authentication, no idempotency).
pub fn public_endpoint(
    request: Request,
    handler: impl FnOnce(&Request) -> Result<Reply, Problem>,
) -> Response {
    let request_id = fresh_request_id();
    match handler(&request) {
        Ok(reply) => reply_response(&reply, &request_id),
        Err(problem) => problem_response(&problem, &request_id, request.path()),
    }
}

/// Routes a request with the component's router; the router's own plain-text 404 and 405
/// become problems like every other error.
pub fn dispatch(router: &Router, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.path().to_owned();
    let fallback_id = fresh_request_id();
    let response = router.handle(request);
    let is_problem_or_json = response
        .header("content-type")
        .and_then(|v| v.as_str())
        .is_some_and(|v| v.contains("json"));
    match *response.status() {
        404 if !is_problem_or_json => problem_response(
            &Problem::not_found(format!("no route for {path}")),
            &fallback_id,
            &path,
        ),
        405 if !is_problem_or_json => problem_response(
            &Problem::method_not_allowed(&method.to_string(), &path)
                .with_header("allow", allowed_methods(router, &path).join(", ")),
            &fallback_id,
            &path,
        ),
        _ => response,
    }
}

/// The methods the router serves `path` with, for a 405's `Allow` header (RFC 9110). The
/// router does not expose its table, but its `Display` lists it: `- GET: /v1/vms/:id`.
fn allowed_methods(router: &Router, path: &str) -> Vec<String> {
    let mut methods: Vec<String> = router
        .to_string()
        .lines()
        .filter_map(|line| line.strip_prefix("- ")?.split_once(": "))
        .filter(|(_, route)| route_matches(route, path))
        .map(|(method, _)| method.to_owned())
        .collect();
    // The router answers HEAD with the GET handler.
    if methods.iter().any(|m| m == "GET") {
        methods.push("HEAD".to_owned());
    }
    methods.sort();
    methods.dedup();
    methods
}

/// Whether a router pattern (`/v1/nodes/:nodeId`, or `/console/*` with a trailing wildcard
/// that matches the rest of the path) matches a concrete path.
fn route_matches(route: &str, path: &str) -> bool {
    let (route, wildcard) = match route.strip_suffix("/*") {
        Some(prefix) => (prefix, true),
        None => (route, false),
    };
    let route: Vec<&str> = route.trim_end_matches('/').split('/').collect();
    let mut path: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    if wildcard && path.len() > route.len() {
        path.truncate(route.len());
    }
    route.len() == path.len()
        && route.iter().zip(&path).all(|(pattern, segment)| {
            pattern == segment || (pattern.starts_with(':') && !segment.is_empty())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: Request, _: Params) -> Response {
        Response::new(200, ())
    }

    #[test]
    fn allow_lists_the_methods_of_the_matching_routes() {
        let mut router = Router::new();
        router.get("/v1/vms", ok);
        router.post("/v1/vms", ok);
        router.get("/v1/vms/:id", ok);
        router.delete("/v1/vms/:id", ok);
        assert_eq!(allowed_methods(&router, "/v1/vms"), ["GET", "HEAD", "POST"]);
        assert_eq!(
            allowed_methods(&router, "/v1/vms/vm-1"),
            ["DELETE", "GET", "HEAD"]
        );
        assert!(allowed_methods(&router, "/v1/vms/vm-1/x").is_empty());
        assert!(!route_matches("/v1/vms/:id", "/v1/vms/"));
    }

    #[test]
    fn a_trailing_wildcard_matches_what_follows_its_prefix() {
        let mut router = Router::new();
        router.get("/console", ok);
        router.get("/console/*", ok);
        assert_eq!(allowed_methods(&router, "/console"), ["GET", "HEAD"]);
        assert_eq!(
            allowed_methods(&router, "/console/js/main.js"),
            ["GET", "HEAD"]
        );
        assert!(route_matches("/n/:id/*", "/n/7/a/b"));
        assert!(!route_matches("/console/*", "/consoles/x"));
        assert!(!route_matches("/console/*", "/other/x"));
    }
}
