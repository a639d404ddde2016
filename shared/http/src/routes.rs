//! The app's one route table: every route, the component that serves it, its method, its
//! pattern (Spin's syntax, exactly as in spin.toml) and the kind of endpoint it is.
//!
//! Each component binds its handlers to its rows of this table (see [`crate::routes!`]),
//! requests are matched against it and its 404 and 405 (with `Allow`) come from it, and the
//! end-to-end suites check spin.toml, the OpenAPI document, the README and the
//! authorization sweep against it. It is plain data, so native tests can read it.
//!
//! Below the table: the request as it arrives (its head, read before its body) and serving
//! a component's routes from the table (`serve`, the `routes!` binding).

use std::future::Future;
use std::pin::Pin;

use Method::{Delete, Get, Post, Put};
use spin_sdk::http::conversions::TryFromIncomingRequest;
use spin_sdk::http::{IncomingRequest, IntoResponse, Method as SpinMethod, Request, Response};
use spin_sdk::wit::wasi::http0_2_0::types::IncomingBody;
use wasi::clocks::monotonic_clock;
use wasi::io::poll;
use wasi::io::streams::StreamError;

use crate::execute::authenticated;
use crate::input::{Answer, Call};
use crate::problem::Problem;
use crate::render::{Reply, outcome_response, problem_response};
use crate::request_log;

/// The largest request body by default, in bytes.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;
/// Bodies that may carry a whole node's unit list.
pub const LARGE_MAX_BODY: usize = 8 * 1024 * 1024;

/// An HTTP method a route is served with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }
}

/// How an endpoint treats `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// A mutation: the first response is recorded and replayed for retries.
    Record,
    /// Reads and dry runs: the header is accepted and validated, nothing is recorded, so a
    /// later call always reflects the current state.
    Ignore,
}

/// What an authenticated endpoint needs from the request machinery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Whether a request changes anything (a dry run changes nothing).
    pub writes: bool,
    pub max_body: usize,
    /// Whether a request may hold its instance waiting (the events feed's long poll): one
    /// token's such requests are admitted a few at a time before anything touches the
    /// database (docs/design.md, "The events feed").
    pub waits: bool,
}

impl Endpoint {
    pub const READ: Endpoint = Endpoint {
        writes: false,
        max_body: DEFAULT_MAX_BODY,
        waits: false,
    };
    pub const WRITE: Endpoint = Endpoint {
        writes: true,
        max_body: DEFAULT_MAX_BODY,
        waits: false,
    };
    pub const LARGE_WRITE: Endpoint = Endpoint {
        writes: true,
        max_body: LARGE_MAX_BODY,
        waits: false,
    };
    /// A POST that writes nothing is served like a read: a later call reflects the state.
    pub const DRY_RUN: Endpoint = Endpoint::READ;
    /// A read that may wait for what it reads.
    pub const WAITING_READ: Endpoint = Endpoint {
        waits: true,
        ..Endpoint::READ
    };

    /// Whether the endpoint changes nothing.
    pub fn is_read(&self) -> bool {
        !self.writes
    }

    /// How the endpoint treats `Idempotency-Key`: a write records its first answer.
    pub fn idempotency(&self) -> Idempotency {
        match self.writes {
            true => Idempotency::Record,
            false => Idempotency::Ignore,
        }
    }
}

/// What a request of a route is about, which decides the cell that holds its writes and
/// the idempotency records of its key (docs/design.md, "Cells").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// Orgs and keys, and what spans cells: the directory's cell.
    Directory,
    /// The node the path's `nodeId` names.
    NodeInPath,
    /// The VM the path's `id` names: the cell its id names.
    VmInPath,
    /// The node the JSON body's `nodeId` names (a VM's placement).
    NodeInBody,
}

impl Route {
    /// What a request of this route is about: the node its path names, the VM its path
    /// names, for a VM's placement the node its body names; else the directory.
    pub const fn home(&self) -> Home {
        if pattern_has(self.pattern, b"/:nodeId") {
            Home::NodeInPath
        } else if str_eq(self.pattern, "/v1/vms/:id") {
            Home::VmInPath
        } else if str_eq(self.pattern, "/v1/vms") && self.method as u8 == Method::Post as u8 {
            Home::NodeInBody
        } else {
            Home::Directory
        }
    }
}

/// Whether `pattern` contains `part`.
const fn pattern_has(pattern: &str, part: &[u8]) -> bool {
    let pattern = pattern.as_bytes();
    let mut start = 0;
    while start + part.len() <= pattern.len() {
        let mut i = 0;
        while i < part.len() && pattern[start + i] == part[i] {
            i += 1;
        }
        if i == part.len() {
            return true;
        }
        start += 1;
    }
    false
}

/// The kind of endpoint a route is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No authentication; a JSON answer (health, the OpenAPI document).
    Public,
    /// No authentication; a file of the capacity console, not JSON.
    ConsoleFile,
    /// An org key, an operator key or the operator credential; the body is read only after
    /// the caller is known.
    Authenticated(Endpoint),
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The component's id in spin.toml.
    pub component: &'static str,
    pub method: Method,
    /// Spin's syntax: `:name` for a segment, a trailing `/...` for the rest of the path.
    pub pattern: &'static str,
    pub kind: Kind,
    /// The name of the component's function that serves it, which [`crate::routes!`] binds
    /// at compile time.
    pub handler: &'static str,
}

const fn route(
    component: &'static str,
    method: Method,
    pattern: &'static str,
    kind: Kind,
    handler: &'static str,
) -> Route {
    Route {
        component,
        method,
        pattern,
        kind,
        handler,
    }
}

const PUBLIC: Kind = Kind::Public;
const FILE: Kind = Kind::ConsoleFile;
const READ: Kind = Kind::Authenticated(Endpoint::READ);
const WRITE: Kind = Kind::Authenticated(Endpoint::WRITE);
const LARGE_WRITE: Kind = Kind::Authenticated(Endpoint::LARGE_WRITE);
const DRY_RUN: Kind = Kind::Authenticated(Endpoint::DRY_RUN);
const WAITING_READ: Kind = Kind::Authenticated(Endpoint::WAITING_READ);

#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    route("meta", Get, "/v1/healthz", PUBLIC, "health"),
    route("meta", Get, "/v1/openapi.json", PUBLIC, "openapi"),

    route("identity", Get, "/v1/whoami", READ, "whoami"),
    route("identity", Post, "/v1/orgs", WRITE, "create_org"),
    route("identity", Get, "/v1/orgs/:orgId", READ, "get_org"),
    route("identity", Post, "/v1/orgs/:orgId/keys", WRITE, "create_key"),
    route("identity", Get, "/v1/orgs/:orgId/keys", READ, "list_keys"),
    route("identity", Delete, "/v1/orgs/:orgId/keys/:keyId", WRITE, "revoke_key"),
    route("identity", Post, "/v1/operator/keys", WRITE, "create_operator_key"),
    route("identity", Get, "/v1/operator/keys", READ, "list_operator_keys"),
    route("identity", Delete, "/v1/operator/keys/:keyId", WRITE, "revoke_operator_key"),

    route("nodes", Get, "/v1/nodes", READ, "list_nodes"),
    route("nodes", Get, "/v1/nodes/:nodeId", READ, "get_node"),
    route("nodes", Put, "/v1/nodes/:nodeId", LARGE_WRITE, "put_node"),
    route("nodes", Get, "/v1/market", READ, "list_market"),

    route("reservations", Post, "/v1/nodes/:nodeId/reservations", LARGE_WRITE, "create"),
    route("reservations", Get, "/v1/nodes/:nodeId/reservations", READ, "list"),
    route("reservations", Get, "/v1/nodes/:nodeId/reservations/:id", READ, "get"),
    route("reservations", Post, "/v1/nodes/:nodeId/reservations/:id/cancel", WRITE, "cancel"),
    route("reservations", Post, "/v1/nodes/:nodeId/reservations/:id/reaffirm", LARGE_WRITE, "reaffirm"),

    route("release", Post, "/v1/nodes/:nodeId/reservations/:id/release", WRITE, "release"),
    route("reclaim", Post, "/v1/nodes/:nodeId/reservations/:id/reclaim", WRITE, "reclaim"),
    route("dry-run", Post, "/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run", DRY_RUN, "reclaim_dry_run"),

    route("vms", Post, "/v1/vms", WRITE, "place"),
    route("vms", Get, "/v1/vms", READ, "list"),
    route("vms", Get, "/v1/vms/:id", READ, "get"),
    route("vms", Delete, "/v1/vms/:id", WRITE, "terminate"),

    route("audit", Get, "/v1/audit", READ, "list_events"),
    route("audit", Get, "/v1/audit/verify", READ, "verify_chain"),
    route("audit", Get, "/v1/events", WAITING_READ, "events_feed"),

    route("console", Get, "/console", FILE, "page"),
    route("console", Get, "/console/...", FILE, "named_file"),
];

/// The routes `component` serves.
pub fn of_component(component: &str) -> impl Iterator<Item = &'static Route> {
    ROUTES.iter().filter(move |r| r.component == component)
}

/// The methods `component` serves `path` with, for a 405's `Allow` header (RFC 9110):
/// sorted, with `HEAD` wherever `GET` is (the router answers HEAD with the GET handler).
pub fn allowed_methods(component: &str, path: &str) -> Vec<&'static str> {
    let mut methods: Vec<&'static str> = of_component(component)
        .filter(|r| pattern_matches(r.pattern, path))
        .map(|r| r.method.as_str())
        .collect();
    if methods.contains(&"GET") {
        methods.push("HEAD");
    }
    methods.sort_unstable();
    methods.dedup();
    methods
}

/// Whether a pattern (`/v1/nodes/:nodeId`, or `/console/...` whose trailing wildcard
/// matches the rest of the path) matches a concrete path.
pub fn pattern_matches(pattern: &'static str, path: &str) -> bool {
    path_params(pattern, path).is_some()
}

/// What a path says in the places its route's pattern names: each `:name`'s segment (as
/// sent, not percent-decoded) and, after a trailing wildcard, the rest of the path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PathParams {
    named: Vec<(&'static str, String)>,
    rest: Option<String>,
}

impl PathParams {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, value)| value.as_str())
    }

    /// The value of the pattern's one parameter; `None` if it has none or several.
    pub fn only(&self) -> Option<&str> {
        match &self.named[..] {
            [(_, value)] => Some(value),
            _ => None,
        }
    }

    /// What follows a trailing wildcard's prefix, without its leading `/`.
    pub fn wildcard(&self) -> Option<&str> {
        self.rest.as_deref()
    }
}

/// The parameters of `path` under `pattern`, if the pattern matches it. Trailing slashes
/// are ignored, except in what a wildcard matches.
pub fn path_params(pattern: &'static str, path: &str) -> Option<PathParams> {
    let (prefix, wildcard) = match pattern.strip_suffix("/...") {
        Some(prefix) => (prefix, true),
        None => (pattern, false),
    };
    let mut params = PathParams::default();
    let mut rest = Some(path);
    for expected in prefix.trim_end_matches('/').split('/') {
        let (segment, after) = match rest?.split_once('/') {
            Some((segment, after)) => (segment, Some(after)),
            None => (rest?, None),
        };
        match expected.strip_prefix(':') {
            Some(name) if !segment.is_empty() => params.named.push((name, segment.to_owned())),
            None if expected == segment => {}
            _ => return None,
        }
        rest = after;
    }
    let rest = rest.unwrap_or_default();
    if wildcard {
        params.rest = Some(rest.to_owned());
    } else if !rest.bytes().all(|b| b == b'/') {
        return None;
    }
    Some(params)
}

/// The route of `component` that `handler` serves. A `const fn`, so that a handler the table
/// does not name stops the component from compiling (see [`crate::routes!`]).
pub const fn route_of(component: &str, handler: &str) -> &'static Route {
    let mut i = 0;
    while i < ROUTES.len() {
        let route = &ROUTES[i];
        if str_eq(route.component, component) && str_eq(route.handler, handler) {
            return route;
        }
        i += 1;
    }
    panic!("the route table names no route of this component for this handler")
}

pub(crate) const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// ============================================================================================
// The request as it arrives
//
// The request as it arrives: what is read from its head before its body (its ids,
// single-valued headers, a declared length over the endpoint's limit), and its body only
// when an endpoint asks for it — after authentication, up to the endpoint's size limit,
// within a deadline.
//
// Spin SDK's own `Request` reads the whole body before the component sees anything, so a
// stranger without a token could make the server hold any number of bytes, for as long as
// they care to send them. Here the component's handler parameter ([`Incoming`]) carries the
// head (a `Request` with an empty body) and the [`UnreadBody`] beside it, which the endpoint
// reads with [`UnreadBody::read`] once the caller is known (or never, and it is dropped).

// The wasi:http body type; spin-sdk names it only in its (public, undocumented) bindings.

/// How many bytes one read asks the host for.
const READ_CHUNK: u64 = 64 * 1024;

/// Headers a request may carry once: two values would let a proxy and this service
/// disagree about which one counts.
const SINGLE_VALUED: &[&str] = &[
    "authorization",
    "bookmark",
    "idempotency-key",
    "content-type",
    "content-length",
    "x-request-id",
];

/// A request as it arrives: its head, and its body still unread. The parameter of every
/// component's handler, split once by [`crate::routes::serve`] and the body handed on to
/// the endpoint, which reads it after authentication.
pub struct Incoming {
    pub head: Request,
    /// Single-valued headers that came more than once.
    pub repeated_headers: Vec<&'static str>,
    pub body: UnreadBody,
}

/// A request body not read yet: read once with [`UnreadBody::read`], or dropped unread.
#[derive(Default)]
pub struct UnreadBody(Option<IncomingBody>);

impl UnreadBody {
    /// The body, read to its end: a 413 as soon as it passes `limit` bytes (what was read
    /// is dropped at once), a 408 when it has not all arrived within `deadline_ms`, a 400
    /// when the client's framing breaks. Without a body, no bytes.
    pub fn read(self, limit: usize, deadline_ms: u64) -> Result<Vec<u8>, Problem> {
        let Some(body) = self.0 else {
            return Ok(Vec::new());
        };
        let stream = body
            .stream()
            .map_err(|()| unreadable("the body stream is not available"))?;
        let deadline = monotonic_clock::subscribe_duration(deadline_ms.saturating_mul(1_000_000));
        let readable = stream.subscribe();
        let mut bytes = Vec::new();
        let outcome = loop {
            match stream.read(READ_CHUNK) {
                Ok(chunk) if chunk.is_empty() => {
                    if poll::poll(&[&readable, &deadline]) == [1] {
                        break Err(Problem::new(
                            408,
                            "request-timeout",
                            "Request timeout",
                            format!("the body did not arrive within {deadline_ms} ms"),
                        ));
                    }
                }
                Ok(chunk) if bytes.len() + chunk.len() > limit => {
                    break Err(Problem::payload_too_large(limit, None));
                }
                Ok(chunk) => bytes.extend(chunk),
                Err(StreamError::Closed) => break Ok(bytes),
                Err(StreamError::LastOperationFailed(e)) => {
                    break Err(unreadable(&e.to_debug_string()));
                }
            }
        };
        drop(readable);
        drop(stream);
        drop(deadline);
        let _trailers = IncomingBody::finish(body);
        outcome
    }
}

fn unreadable(reason: &str) -> Problem {
    Problem::bad_request(
        "unreadable-body",
        format!("the request body could not be read: {reason}"),
    )
}

/// A request whose head cannot be turned into a [`Request`] (never seen in practice: the
/// host has already parsed it), answered as a problem rather than Spin SDK's plain 500.
pub struct UnusableHead {
    path: String,
}

impl TryFromIncomingRequest for Incoming {
    type Error = UnusableHead;

    fn try_from_incoming_request<'a>(
        request: IncomingRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Self, Self::Error>> + Send + 'a>>
    where
        Self: Sized + 'a,
    {
        Box::pin(async move {
            let headers = request.headers();
            let entries = headers.entries();
            let repeated_headers = SINGLE_VALUED
                .iter()
                .copied()
                .filter(|name| {
                    entries
                        .iter()
                        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                        .count()
                        > 1
                })
                .collect();
            let head = Request::builder()
                .method(request.method())
                .uri(request.uri())
                .headers(headers)
                .build();
            let body = UnreadBody(request.consume().ok());
            if head.path().is_empty() {
                return Err(UnusableHead {
                    path: request.path_with_query().unwrap_or_default(),
                });
            }
            Ok(Incoming {
                head,
                repeated_headers,
                body,
            })
        })
    }
}

impl IntoResponse for UnusableHead {
    fn into_response(self) -> Response {
        let path = self.path.split('?').next().unwrap_or_default().to_owned();
        let problem = Problem::bad_request("malformed-request", "the request line is unusable");
        problem_response(&problem, &fresh_request_id(), &path)
    }
}

pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// A request's ids: the server's own, and the one the client sent (kept beside it, never
/// instead of it: two callers could send the same one).
#[derive(Debug, Clone)]
pub struct RequestIds {
    pub server: String,
    pub client: Option<String>,
}

impl RequestIds {
    pub(crate) fn of(request: &Request) -> RequestIds {
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

/// The one value of a header that may appear once; a repeated one is a 400.
pub(crate) fn single_header<'r>(
    request: &'r Request,
    repeated_headers: &[&'static str],
    name: &'static str,
) -> Result<Option<&'r str>, Problem> {
    if repeated_headers.contains(&name) {
        return Err(Problem::bad_request(
            "repeated-header",
            format!("the {name} header may appear once"),
        )
        .with("header", name));
    }
    Ok(request.header(name).map(|v| v.as_str().unwrap_or("\u{0}")))
}

/// A declared body longer than the endpoint takes is refused before any of it is read.
pub(crate) fn refuse_declared_oversize(request: &Request, max_body: usize) -> Result<(), Problem> {
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

// ============================================================================================
// Serving a component
//
// Serving a component: the request matched against the component's rows of
// [`crate::routes::ROUTES`], each bound at compile time to the function that serves it
// ([`crate::routes!`]), and served as its kind of endpoint; a path the component does not
// serve is a 404 and a method it does not serve there a 405 whose `Allow` the table gives.

/// The function that serves an authenticated endpoint: its answer, or the operation that
/// makes it ([`crate::execute`] runs it).
pub type AuthenticatedHandler = fn(&Call<'_>) -> Result<Answer, Problem>;
/// The function that serves a public endpoint.
pub type PublicHandler = fn(&Request) -> Result<Reply, Problem>;
/// The function that serves a file of the console.
pub type ConsoleFileHandler = fn(&Request, &PathParams) -> Response;

/// A route of the table with the function that serves it, of the signature its kind of
/// endpoint calls. Made only by [`crate::routes!`], whose constructors refuse (at compile
/// time) a function of the wrong kind for its route.
#[derive(Clone, Copy)]
pub struct Bound {
    route: &'static Route,
    serve: Serve,
}

#[derive(Clone, Copy)]
enum Serve {
    Authenticated(Endpoint, AuthenticatedHandler),
    Public(PublicHandler),
    ConsoleFile(ConsoleFileHandler),
}

impl Bound {
    pub const fn authenticated(route: &'static Route, handler: AuthenticatedHandler) -> Bound {
        match route.kind {
            Kind::Authenticated(endpoint) => Bound {
                route,
                serve: Serve::Authenticated(endpoint, handler),
            },
            _ => panic!("a route of the table that is not an authenticated endpoint"),
        }
    }

    pub const fn public(route: &'static Route, handler: PublicHandler) -> Bound {
        match route.kind {
            Kind::Public => Bound {
                route,
                serve: Serve::Public(handler),
            },
            _ => panic!("a route of the table that is not a public endpoint"),
        }
    }

    pub const fn console_file(route: &'static Route, handler: ConsoleFileHandler) -> Bound {
        match route.kind {
            Kind::ConsoleFile => Bound {
                route,
                serve: Serve::ConsoleFile(handler),
            },
            _ => panic!("a route of the table that is not a console file"),
        }
    }

    pub const fn route(&self) -> &'static Route {
        self.route
    }
}

/// A component's routes, each with the function that serves it. A function the table does
/// not name for the component, one of the wrong kind for its route, or a route of the
/// component with no function, fails to compile.
///
/// ```
/// use reservations_http::{Call, Problem, Read, routes};
/// fn release(_: &Call<'_>) -> Result<Read, Problem> {
///     Err(Problem::internal("an example"))
/// }
/// let bound = routes!("release"; authenticated: release);
/// assert_eq!(bound[0].route().pattern, "/v1/nodes/:nodeId/reservations/:id/release");
/// ```
///
/// A route of the component left without its function:
/// ```compile_fail,E0080
/// # use reservations_http::{Call, Problem, Read, routes};
/// # fn place(_: &Call<'_>) -> Result<Read, Problem> { Err(Problem::internal("")) }
/// # fn list(_: &Call<'_>) -> Result<Read, Problem> { Err(Problem::internal("")) }
/// # fn get(_: &Call<'_>) -> Result<Read, Problem> { Err(Problem::internal("")) }
/// let bound = routes!("vms"; authenticated: place, list, get); // no `terminate`
/// ```
///
/// A function the table does not name:
/// ```compile_fail,E0080
/// # use reservations_http::{Call, Problem, Read, routes};
/// fn release_all(_: &Call<'_>) -> Result<Read, Problem> {
///     Err(Problem::internal("an example"))
/// }
/// let bound = routes!("release"; authenticated: release_all);
/// ```
#[macro_export]
macro_rules! routes {
    ($component:literal; $($kind:ident: $($handler:ident),+ $(,)?);+ $(;)?) => {{
        const BOUND: &[$crate::routes::Bound] = &[$($(
            $crate::routes::Bound::$kind(
                $crate::routes::route_of($component, stringify!($handler)),
                $crate::bind_handler!($kind, $handler),
            )
        ),+),+];
        const _: () = assert!(
            $crate::routes::covers_component($component, BOUND),
            "a route of this component in the table has no function"
        );
        BOUND
    }};
}

/// The function [`routes!`] binds for a handler: an authenticated endpoint's handler is
/// called with the inputs it names ([`crate::input::Handler`]); the others as they are.
#[doc(hidden)]
#[macro_export]
macro_rules! bind_handler {
    (authenticated, $handler:ident) => {
        |call: &$crate::Call<'_>| $crate::input::Handler::serve(&$handler, call)
    };
    ($kind:ident, $handler:ident) => {
        $handler
    };
}

/// Whether `bound` serves every route of `component` in the table, for [`routes!`]: with
/// [`route_of`], a component serves exactly its routes of the table or does not
/// compile.
pub const fn covers_component(component: &str, bound: &[Bound]) -> bool {
    let mut i = 0;
    while i < ROUTES.len() {
        let route = &ROUTES[i];
        if str_eq(route.component, component) {
            let mut j = 0;
            let mut found = false;
            while j < bound.len() {
                found |= bound[j].route.method as u8 == route.method as u8
                    && str_eq(bound[j].route.pattern, route.pattern);
                j += 1;
            }
            if !found {
                return false;
            }
        }
        i += 1;
    }
    true
}

/// Serves a request with the component's `routes` (see [`routes!`]), and writes its log
/// record (see [`request_log`]).
pub fn serve(routes: &[Bound], incoming: Incoming) -> Response {
    let started = std::time::Instant::now();
    let method = incoming.head.method().to_string();
    let path = incoming.head.path().to_owned();
    let (route, response) = serve_routed(routes, incoming);
    request_log::write(&method, route, &path, &response, started);
    response
}

/// The route that took the request (none: no route did), and its answer.
fn serve_routed(routes: &[Bound], incoming: Incoming) -> (Option<&'static str>, Response) {
    let Incoming {
        head,
        repeated_headers,
        body,
    } = incoming;
    let path = head.path().to_owned();
    let method = table_method(head.method());
    let matched = routes.iter().find_map(|bound| {
        (Some(bound.route.method) == method)
            .then(|| path_params(bound.route.pattern, &path))
            .flatten()
            .map(|params| (bound, params))
    });
    let Some((bound, params)) = matched else {
        return (None, unrouted(routes, head.method(), &path));
    };
    let response = match bound.serve {
        Serve::Authenticated(endpoint, handler) => {
            let ids = RequestIds::of(&head);
            let head = Head {
                request: &head,
                repeated_headers: &repeated_headers,
                params: &params,
            };
            match authenticated(&head, body, (endpoint, bound.route.home()), &ids, handler) {
                Ok(response) => response,
                Err(problem) => problem_response(&problem, &ids.server, &path),
            }
        }
        Serve::Public(handler) => outcome_response(&handler(&head), &fresh_request_id(), &path),
        Serve::ConsoleFile(handler) => handler(&head, &params),
    };
    (Some(bound.route.pattern), response)
}

/// The table's method for an HTTP method; `HEAD` is served as `GET`.
fn table_method(method: &SpinMethod) -> Option<Method> {
    match method {
        SpinMethod::Get | SpinMethod::Head => Some(Method::Get),
        SpinMethod::Post => Some(Method::Post),
        SpinMethod::Put => Some(Method::Put),
        SpinMethod::Delete => Some(Method::Delete),
        _ => None,
    }
}

/// The answer for a request no route of the component takes: 405 with `Allow` when the path
/// is served with other methods, else 404.
fn unrouted(routes: &[Bound], method: &SpinMethod, path: &str) -> Response {
    let request_id = fresh_request_id();
    let allowed = routes
        .first()
        .map(|bound| allowed_methods(bound.route.component, path))
        .unwrap_or_default();
    let problem = match allowed.is_empty() {
        true => Problem::not_found(format!("no route for {path}")),
        false => Problem::method_not_allowed(&method.to_string(), path)
            .with_header("allow", allowed.join(", ")),
    };
    problem_response(&problem, &request_id, path)
}

/// The head of a matched request: what an authenticated endpoint reads before the body.
pub(crate) struct Head<'r> {
    pub request: &'r Request,
    pub repeated_headers: &'r [&'static str],
    pub params: &'r PathParams,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_about_a_node_or_a_vm_is_at_home_in_its_cell() {
        let homes: Vec<(&str, Method, Home)> = ROUTES
            .iter()
            .filter(|route| matches!(route.kind, Kind::Authenticated(_)))
            .filter(|route| route.home() != Home::Directory)
            .map(|route| (route.pattern, route.method, route.home()))
            .collect();
        let node = |pattern, method| (pattern, method, Home::NodeInPath);
        assert_eq!(
            homes,
            [
                node("/v1/nodes/:nodeId", Get),
                node("/v1/nodes/:nodeId", Put),
                node("/v1/nodes/:nodeId/reservations", Post),
                node("/v1/nodes/:nodeId/reservations", Get),
                node("/v1/nodes/:nodeId/reservations/:id", Get),
                node("/v1/nodes/:nodeId/reservations/:id/cancel", Post),
                node("/v1/nodes/:nodeId/reservations/:id/reaffirm", Post),
                node("/v1/nodes/:nodeId/reservations/:id/release", Post),
                node("/v1/nodes/:nodeId/reservations/:id/reclaim", Post),
                node("/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run", Post),
                ("/v1/vms", Post, Home::NodeInBody),
                ("/v1/vms/:id", Get, Home::VmInPath),
                ("/v1/vms/:id", Delete, Home::VmInPath),
            ]
        );
    }

    #[test]
    fn allow_lists_the_methods_of_the_matching_routes() {
        assert_eq!(allowed_methods("vms", "/v1/vms"), ["GET", "HEAD", "POST"]);
        assert_eq!(
            allowed_methods("vms", "/v1/vms/vm-1"),
            ["DELETE", "GET", "HEAD"]
        );
        assert!(allowed_methods("vms", "/v1/vms/vm-1/x").is_empty());
        assert!(!pattern_matches("/v1/vms/:id", "/v1/vms/"));
    }

    #[test]
    fn a_trailing_wildcard_matches_what_follows_its_prefix() {
        assert_eq!(allowed_methods("console", "/console"), ["GET", "HEAD"]);
        assert_eq!(
            allowed_methods("console", "/console/js/main.js"),
            ["GET", "HEAD"]
        );
        assert!(pattern_matches("/n/:id/...", "/n/7/a/b"));
        let params = path_params("/n/:id/...", "/n/7/a/b").expect("matches");
        assert_eq!(
            (params.get("id"), params.wildcard()),
            (Some("7"), Some("a/b"))
        );
        let params = path_params("/console/...", "/console/").expect("matches");
        assert_eq!(params.wildcard(), Some(""));
        let params = path_params("/console/...", "/console/js/").expect("matches");
        assert_eq!(params.wildcard(), Some("js/"));
        let params = path_params(
            "/v1/nodes/:nodeId/reservations/:id",
            "/v1/nodes/n1/reservations/r1",
        )
        .expect("matches");
        assert_eq!(
            (params.get("nodeId"), params.get("id")),
            (Some("n1"), Some("r1"))
        );
        assert!(path_params("/v1/nodes/:nodeId", "/v1/nodes/n1/reservations").is_none());
        assert!(!pattern_matches("/console/...", "/consoles/x"));
        assert!(!pattern_matches("/console/...", "/other/x"));
    }

    #[test]
    fn a_component_serves_each_method_and_pattern_once_with_a_handler_named_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    (a.method, a.pattern) != (b.method, b.pattern),
                    "{} {} is in the table twice",
                    a.method.as_str(),
                    a.pattern
                );
                assert!(
                    (a.component, a.handler) != (b.component, b.handler),
                    "{} binds {} twice",
                    a.component,
                    a.handler
                );
            }
        }
    }
}
