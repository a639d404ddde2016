//! Serving a component: the request matched against the component's rows of
//! [`crate::routes::ROUTES`], each bound at compile time to the function that serves it
//! ([`crate::routes!`]), and served as its kind of endpoint; a path the component does not
//! serve is a 404 and a method it does not serve there a 405 whose `Allow` the table gives.

use spin_sdk::http::{Method as SpinMethod, Request, Response};

use crate::execute::authenticated;
use crate::incoming::Incoming;
use crate::incoming::{RequestIds, fresh_request_id};
use crate::input::{Answer, Call};
use crate::problem::Problem;
use crate::request_log;
use crate::response::{Reply, outcome_response, problem_response};
use crate::routes::{self, Endpoint, Kind, Method, PathParams, Route};

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
/// use reservations_http::{Call, Problem, Reply, routes};
/// fn release(_: &Call<'_>) -> Result<Reply, Problem> {
///     Err(Problem::internal("an example"))
/// }
/// let bound = routes!("release"; authenticated: release);
/// assert_eq!(bound[0].route().pattern, "/v1/nodes/:nodeId/reservations/:id/release");
/// ```
///
/// A route of the component left without its function:
/// ```compile_fail,E0080
/// # use reservations_http::{Call, Problem, Reply, routes};
/// # fn place(_: &Call<'_>) -> Result<Reply, Problem> { Err(Problem::internal("")) }
/// # fn list(_: &Call<'_>) -> Result<Reply, Problem> { Err(Problem::internal("")) }
/// # fn get(_: &Call<'_>) -> Result<Reply, Problem> { Err(Problem::internal("")) }
/// let bound = routes!("vms"; authenticated: place, list, get); // no `terminate`
/// ```
///
/// A function the table does not name:
/// ```compile_fail,E0080
/// # use reservations_http::{Call, Problem, Reply, routes};
/// fn release_all(_: &Call<'_>) -> Result<Reply, Problem> {
///     Err(Problem::internal("an example"))
/// }
/// let bound = routes!("release"; authenticated: release_all);
/// ```
#[macro_export]
macro_rules! routes {
    ($component:literal; $($kind:ident: $($handler:ident),+ $(,)?);+ $(;)?) => {{
        const BOUND: &[$crate::dispatch::Bound] = &[$($(
            $crate::dispatch::Bound::$kind(
                $crate::routes::route_of($component, stringify!($handler)),
                $crate::bind_handler!($kind, $handler),
            )
        ),+),+];
        const _: () = assert!(
            $crate::dispatch::covers_component($component, BOUND),
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
/// [`routes::route_of`], a component serves exactly its routes of the table or does not
/// compile.
pub const fn covers_component(component: &str, bound: &[Bound]) -> bool {
    let mut i = 0;
    while i < routes::ROUTES.len() {
        let route = &routes::ROUTES[i];
        if routes::str_eq(route.component, component) {
            let mut j = 0;
            let mut found = false;
            while j < bound.len() {
                found |= bound[j].route.method as u8 == route.method as u8
                    && routes::str_eq(bound[j].route.pattern, route.pattern);
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
            .then(|| routes::path_params(bound.route.pattern, &path))
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
        .map(|bound| routes::allowed_methods(bound.route.component, path))
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
