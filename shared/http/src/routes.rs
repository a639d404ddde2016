//! The app's one route table: every route, the component that serves it, its method, its
//! pattern (Spin's syntax, exactly as in spin.toml) and the kind of endpoint it is.
//!
//! Each component binds its handlers to its rows of this table (see [`crate::routes!`]),
//! requests are matched against it and its 404 and 405 (with `Allow`) come from it, and the
//! end-to-end suites check spin.toml, the OpenAPI document, the README and the
//! authorization sweep against it. It is plain data, so native tests can read it.

use Method::{Delete, Get, Post, Put};

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
