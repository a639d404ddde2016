//! Serving a component: its routes from [`crate::routes::ROUTES`], each bound to the
//! handler the table names and served as its kind of endpoint; the router's own plain 404
//! and 405 turned into problems, the 405's `Allow` read from the table.

use chrono::Utc;
use reservations_store::Store;
use spin_sdk::http::{Method as SpinMethod, Params, Request, Response, Router};

use crate::auth::{authenticate, bearer_token};
use crate::config::AppConfig;
use crate::idempotency::{self, Attempt};
use crate::incoming::take_arrival;
use crate::problem::Problem;
use crate::request::{Call, RequestIds, fresh_request_id, refuse_declared_oversize, single_header};
use crate::response::{Reply, outcome_response, problem_response};
use crate::routes::{self, Endpoint, Kind, Method, Route};
use crate::spin_store::SpinDb;

/// A component's function for a route, of the signature its kind of endpoint calls.
#[derive(Clone, Copy)]
pub enum Handler {
    Authenticated(fn(&Call<'_>) -> Result<Reply, Problem>),
    Public(fn(&Request) -> Result<Reply, Problem>),
    ConsoleFile(fn(&Request, &Params) -> Response),
}

/// A component's handlers, each under its own function name:
/// `handlers![Authenticated: place, list]`, `handlers![Public: health]`.
#[macro_export]
macro_rules! handlers {
    ($($kind:ident: $($name:ident),+ $(,)?);+ $(;)?) => {
        &[$($((stringify!($name), $crate::Handler::$kind($name))),+),+]
    };
}

/// A route of the table with the handler that serves it.
#[derive(Clone, Copy)]
enum Bound {
    Authenticated(Endpoint, fn(&Call<'_>) -> Result<Reply, Problem>),
    Public(fn(&Request) -> Result<Reply, Problem>),
    ConsoleFile(fn(&Request, &Params) -> Response),
}

fn bind(route: &Route, handlers: &[(&str, Handler)]) -> Result<Bound, String> {
    let handler = handlers
        .iter()
        .find(|(name, _)| *name == route.handler)
        .map(|(_, handler)| *handler)
        .ok_or_else(|| format!("the component has no handler {}", route.handler))?;
    match (route.kind, handler) {
        (Kind::Authenticated(endpoint), Handler::Authenticated(f)) => {
            Ok(Bound::Authenticated(endpoint, f))
        }
        (Kind::Public, Handler::Public(f)) => Ok(Bound::Public(f)),
        (Kind::ConsoleFile, Handler::ConsoleFile(f)) => Ok(Bound::ConsoleFile(f)),
        _ => Err(format!(
            "{} is a {:?} route, but its handler {} is not of that kind",
            route.pattern, route.kind, route.handler
        )),
    }
}

impl Bound {
    fn serve(self, request: Request, params: Params) -> Response {
        match self {
            Bound::Authenticated(endpoint, handler) => {
                authenticated(&request, &params, endpoint, handler)
            }
            Bound::Public(handler) => {
                let request_id = fresh_request_id();
                outcome_response(&handler(&request), &request_id, request.path())
            }
            Bound::ConsoleFile(handler) => handler(&request, &params),
        }
    }
}

/// The Spin SDK router's pattern for a table pattern: its trailing wildcard is `/*`.
fn router_pattern(pattern: &str) -> String {
    match pattern.strip_suffix("/...") {
        Some(prefix) => format!("{prefix}/*"),
        None => pattern.to_owned(),
    }
}

fn spin_method(method: Method) -> SpinMethod {
    match method {
        Method::Get => SpinMethod::Get,
        Method::Post => SpinMethod::Post,
        Method::Put => SpinMethod::Put,
        Method::Delete => SpinMethod::Delete,
    }
}

/// A router for `component`'s routes in the table, or what keeps a route from its handler
/// (a handler the table does not name counts too).
fn router(component: &str, handlers: &[(&str, Handler)]) -> Result<Router, String> {
    let mut router = Router::new();
    for route in routes::of_component(component) {
        let bound = bind(route, handlers)?;
        router.add(
            &router_pattern(route.pattern),
            spin_method(route.method),
            move |request: Request, params: Params| bound.serve(request, params),
        );
    }
    match handlers
        .iter()
        .find(|(name, _)| !routes::of_component(component).any(|r| r.handler == *name))
    {
        Some((name, _)) => Err(format!("the route table names no route for {name}")),
        None => Ok(router),
    }
}

/// Serves a request to `component` with its handlers (see [`handlers!`]).
pub fn serve(component: &str, handlers: &[(&str, Handler)], request: Request) -> Response {
    let method = request.method().clone();
    let path = request.path().to_owned();
    let fallback_id = fresh_request_id();
    let router = match router(component, handlers) {
        Ok(router) => router,
        Err(unbound) => {
            eprintln!("component {component}: {unbound}");
            let problem = Problem::internal(format!("component {component} is misbuilt"));
            return problem_response(&problem, &fallback_id, &path);
        }
    };
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
            &Problem::method_not_allowed(&method.to_string(), &path).with_header(
                "allow",
                routes::allowed_methods(component, &path).join(", "),
            ),
            &fallback_id,
            &path,
        ),
        _ => response,
    }
}

/// Serves an authenticated endpoint: every failure, the handler's included, is a problem.
fn authenticated(
    request: &Request,
    params: &Params,
    endpoint: Endpoint,
    handler: fn(&Call<'_>) -> Result<Reply, Problem>,
) -> Response {
    let ids = RequestIds::of(request);
    match call_authenticated(request, params, endpoint, &ids, handler) {
        Ok(response) => response,
        Err(problem) => problem_response(&problem, &ids.server, request.path()),
    }
}

fn call_authenticated(
    request: &Request,
    params: &Params,
    endpoint: Endpoint,
    ids: &RequestIds,
    handler: fn(&Call<'_>) -> Result<Reply, Problem>,
) -> Result<Response, Problem> {
    let mut arrival = take_arrival();
    refuse_declared_oversize(request, endpoint.max_body)?;
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
    let body = arrival.read_body(endpoint.max_body, config.body_deadline_ms)?;
    let attempt = Attempt {
        request,
        ids,
        endpoint,
        key: idempotency::idempotency_key(request, &arrival)?,
        body: &body,
        now: Utc::now(),
    };
    idempotency::serve(&store, &caller, &attempt, |recorder| {
        handler(&Call {
            request,
            params,
            ids,
            now: attempt.now,
            store: &store,
            caller: &caller,
            body: &body,
            recorder,
        })
    })
}
