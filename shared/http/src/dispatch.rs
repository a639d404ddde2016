//! Serving a component: the request matched against the component's rows of
//! [`crate::routes::ROUTES`], each bound at compile time to the function that serves it
//! ([`crate::routes!`]), and served as its kind of endpoint; a path the component does not
//! serve is a 404 and a method it does not serve there a 405 whose `Allow` the table gives.

use chrono::Utc;
use reservations_domain::access::Caller;
use reservations_store::Store;
use reservations_store::cells::{Cell, CellStores, Cells, DIRECTORY_LABEL, Positions};
use spin_sdk::http::{Method as SpinMethod, Request, Response};

use crate::auth::{authenticate, bearer_token};
use crate::bookmark::{self, BookmarkSeal, SentBookmark};
use crate::config::AppConfig;
use crate::forward::{self, HomeApp};
use crate::head::{RequestIds, fresh_request_id, refuse_declared_oversize, single_header};
use crate::idempotency::{self, Attempt, Key};
use crate::incoming::{Incoming, UnreadBody};
use crate::problem::Problem;
use crate::request::Call;
use crate::request_log::{self, Forwarded};
use crate::response::{Reply, outcome_response, problem_response};
use crate::routes::{self, Endpoint, Home, Kind, Method, PathParams, Route};
use crate::spin_store::SpinDb;

/// The function that serves an authenticated endpoint.
pub type AuthenticatedHandler = fn(&Call<'_>) -> Result<Reply, Problem>;
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
struct Head<'r> {
    request: &'r Request,
    repeated_headers: &'r [&'static str],
    params: &'r PathParams,
}

/// Serves an authenticated endpoint: the caller known first, the body read only then, the
/// handler called under the idempotency protocol.
fn authenticated(
    head: &Head<'_>,
    body: UnreadBody,
    (endpoint, home): (Endpoint, Home),
    ids: &RequestIds,
    handler: AuthenticatedHandler,
) -> Result<Response, Problem> {
    let Head {
        request,
        repeated_headers,
        ..
    } = *head;
    refuse_declared_oversize(request, endpoint.max_body)?;
    for name in ["content-type", "content-length", "x-request-id"] {
        single_header(request, repeated_headers, name)?;
    }
    let config = AppConfig::read()?;
    let token = bearer_token(single_header(request, repeated_headers, "authorization")?)?;
    let bookmark = bookmark::requested(request, repeated_headers, config.cells)?;
    if !endpoint.is_read()
        && let Some(home) = &config.home
    {
        return write_at_home(home, head, body, endpoint, ids, &config, bookmark.as_ref());
    }
    let bucket = crate::spin_store::DefaultBucket::default();
    // A waiting request holds its instance and, if admitted, a database connection: one
    // token's many are refused here, before anything touches the database.
    let _admitted = match endpoint.waits && config.feed_requests_per_token > 0 {
        true => admit_waiting_request(&bucket, token, config.feed_requests_per_token)?,
        false => None,
    };
    let audit_key = config.audit_key.as_bytes();
    let share = config.org_write_share;
    let opened = |db, label: &str| -> Result<Store<'_>, reservations_store::StoreError> {
        let store = Store::keyed(db, audit_key)?
            .remembering_its_site(&bucket, &config.remembered_as(label));
        Ok(match share > 0 {
            true => store.with_write_shares(&bucket, share),
            false => store,
        })
    };
    let databases: Vec<SpinDb> = config
        .cells
        .all()
        .map(|cell| SpinDb::open(&cell.label()))
        .collect();
    let directory = opened(&databases[0], DIRECTORY_LABEL)?;
    let mut others = Vec::new();
    for (cell, db) in config.cells.all().zip(&databases).skip(1) {
        others.push(opened(db, &cell.label())?.with_directory(&directory));
    }
    let stores = CellStores::new(config.cells, &directory, others);
    let credentials = Credentials {
        token,
        config: &config,
        bookmark,
    };
    let served = serve_caller(
        head,
        body,
        (endpoint, home),
        ids,
        handler,
        &stores,
        &credentials,
    );
    // A cell whose database this request lost is reported by health for a while.
    for (cell, store) in stores.all().skip(1) {
        if store.lost_its_database() {
            crate::cell_health::remember_lost(&bucket, &cell.label(), Utc::now());
        }
    }
    served
}

/// A write at an app that is not its home (docs/design.md, "Writes at home"): sent whole to
/// the home, which authenticates it and runs it beside the primaries, and answered as the home
/// answered once this site's copy has what it wrote. The body is read first, within the
/// endpoint's limit and the deadline, so that a lost answer can be asked again.
fn write_at_home(
    home: &HomeApp,
    head: &Head<'_>,
    body: UnreadBody,
    endpoint: Endpoint,
    ids: &RequestIds,
    config: &AppConfig,
    sent: Option<&SentBookmark>,
) -> Result<Response, Problem> {
    let audit_key = config.audit_key.as_bytes();
    if forward::arrival(head.request, audit_key).is_some() {
        return Err(forward::loop_refused());
    }
    // An Idempotency-Key sent twice, or not of the allowed form, is refused here as at home:
    // the home would see only one of the values.
    idempotency::idempotency_key(head.request, head.repeated_headers)?;
    let body = body.read(endpoint.max_body, config.body_deadline_ms)?;
    request_log::forwarded(Forwarded::ToHome);
    let forwarded = forward::forward(home, head.request, &body, &ids.server, audit_key)?;
    if forwarded.sends > 1 {
        eprintln!(
            "request {}: its answer was lost {} times on the way from the home",
            ids.server,
            forwarded.sends - 1
        );
    }
    if let Some(answered) = &forwarded.bookmark {
        copy_reaches(config, answered, sent);
    }
    Ok(forwarded.response)
}

/// Waits until this site's copy of each cell a forwarded write moved has the position the
/// home answered (read-your-writes at a site). A copy cut off from its primary is not waited
/// for past [`reservations_store::site::COPY_REACHES_WRITE_WITHIN`]: the write is done, and
/// its bookmark says so.
fn copy_reaches(config: &AppConfig, answered: &str, sent: Option<&SentBookmark>) {
    let seal = BookmarkSeal::new(config.audit_key.as_bytes());
    let Some(wanted) = bookmark::opened(&seal, answered, config.cells) else {
        return;
    };
    let before = sent
        .and_then(|sent| seal.open(sent, config.cells).ok())
        .unwrap_or_else(|| Positions::start(config.cells));
    let bucket = crate::spin_store::DefaultBucket::default();
    for (cell, position) in wanted.past_start() {
        if before.get(cell) >= position {
            continue;
        }
        let label = cell.label();
        let db = SpinDb::open(&label);
        let reached = Store::keyed(&db, config.audit_key.as_bytes())
            .map(|store| store.remembering_its_site(&bucket, &config.remembered_as(&label)))
            .and_then(|store| store.await_copy(position));
        match reached {
            Ok(true) => {}
            Ok(false) => eprintln!(
                "the copy of {label} did not reach the forwarded write at position {position}"
            ),
            Err(e) => eprintln!("the copy of {label} could not be read after a write: {e}"),
        }
    }
}

/// A request that carries a bookmark may come from a client that made its key a moment ago
/// at another site, which this site's copy of the database has not reached yet: at a
/// replica its key is looked for again, at the copy, for as long as a bookmark is waited for,
/// and if it never appears the first refusal is the answer. Nothing is compared with the
/// bookmark before the caller is known, so a stranger learns nothing from it: whatever
/// bookmark it sends, it waits as long and gets the same 401.
fn authenticate_as_the_copy_catches_up(
    store: &Store<'_>,
    token: &str,
    config: &AppConfig,
    refused: Problem,
) -> Result<Caller, Problem> {
    let mut known = None;
    store.found_as_the_copy_catches_up(|| {
        match authenticate(store, token, &config.operator_token) {
            Ok(caller) => {
                known = Some(caller);
                Ok(true)
            }
            Err(problem) if problem.status == 401 => Ok(false),
            Err(problem) => Err(problem),
        }
    })?;
    known.ok_or(refused)
}

/// Admits a waiting request of `token` if fewer than `limit` of its are running; 429
/// `too-many-waits` otherwise, as when the token's key holds all its places.
fn admit_waiting_request<'a>(
    bucket: &'a crate::spin_store::DefaultBucket,
    token: &str,
    limit: i64,
) -> Result<Option<reservations_store::share::Turn<'a>>, Problem> {
    let token_hash = crate::auth::hash_secret(token);
    reservations_store::share::admit_feed_request(bucket, &token_hash, limit).map_err(|refused| {
        Problem::new(
            429,
            "too-many-waits",
            "Too many waiting polls",
            format!(
                "this token already has {limit} requests of the events feed running; resume with one of them"
            ),
        )
        .with_header("retry-after", refused.retry_after_secs.to_string())
    })
}

/// The bearer token a request sent, the app's secrets to check it against, and the
/// `Bookmark` it sent (its seal checked once the caller is known).
struct Credentials<'a> {
    token: &'a str,
    config: &'a AppConfig,
    bookmark: Option<SentBookmark>,
}

/// [`authenticated`] once the databases can be opened: the caller known first (at the
/// directory), the body read only then, the handler called under the idempotency protocol at
/// the request's home cell, a write's answer given its bookmark.
fn serve_caller(
    head: &Head<'_>,
    body: UnreadBody,
    (endpoint, home): (Endpoint, Home),
    ids: &RequestIds,
    handler: AuthenticatedHandler,
    stores: &CellStores<'_>,
    credentials: &Credentials<'_>,
) -> Result<Response, Problem> {
    let Head {
        request,
        repeated_headers,
        params,
    } = *head;
    let Credentials {
        token,
        config,
        ref bookmark,
    } = *credentials;
    let directory = stores.directory();
    let caller = match authenticate(directory, token, &config.operator_token) {
        Err(refused) if bookmark.is_some() && refused.status == 401 => {
            authenticate_as_the_copy_catches_up(directory, token, config, refused)?
        }
        known => known?,
    };
    request_log::caller(&caller);
    // Only for a known caller is the bookmark's seal checked, and any bookmark this API did
    // not seal refused alike: a stranger learns nothing from one, and nobody learns a
    // position from forging one.
    let seal = BookmarkSeal::new(config.audit_key.as_bytes());
    let bookmark = match bookmark {
        Some(sent) => Some(seal.open(sent, config.cells)?),
        None => None,
    };
    // Only for a known caller is the bookmark compared with the database: a stranger learns
    // nothing from it, and asks the primary nothing. A request about one node or VM reads
    // its cell only; any other, every cell the bookmark names.
    let path_cell = cell_named_by_path(stores.cells(), home, params);
    if let Some(position) = &bookmark
        && !bookmark::reached(stores, position, path_cell)?
        && endpoint.is_read()
    {
        return Err(bookmark::not_reached());
    }
    // Only now, for a known caller, is the body read: within the endpoint's limit and the
    // deadline, so no stranger can make the server hold bytes or wait.
    let body = body.read(endpoint.max_body, config.body_deadline_ms)?;
    let home_cell = path_cell
        .or_else(|| cell_named_by_body(stores.cells(), home, &body))
        .unwrap_or(Cell::DIRECTORY);
    request_log::home_cell(home_cell);
    let store = stores.store(home_cell);
    let arrival = forward::arrival(request, config.audit_key.as_bytes());
    if arrival.is_some() {
        request_log::forwarded(Forwarded::FromSite);
    }
    let key = match arrival {
        Some(forward::Arrival {
            own_key: Some(key),
            resent,
        }) => Some(Key::Forwarders { key, resent }),
        _ => idempotency::idempotency_key(request, repeated_headers)?.map(Key::Callers),
    };
    let attempt = Attempt {
        request,
        ids,
        endpoint,
        key,
        body: &body,
        now: Utc::now(),
    };
    // With the market in cells a key's record is in its request's home cell only, so the key
    // is claimed in the directory too (docs/design.md, "Cells").
    let claims = (stores.cells().count() > 1).then(|| stores.directory());
    let mut response = idempotency::serve(store, claims, &caller, &attempt, |recorder| {
        handler(&Call {
            request,
            params,
            ids,
            now: attempt.now,
            store,
            stores,
            caller: &caller,
            body: &body,
            recorder,
        })
    })?;
    if !endpoint.is_read() {
        bookmark::stamp(&mut response, &seal, stores, home_cell, bookmark.as_ref())?;
    }
    Ok(response)
}

/// The cell of the node or VM the path names, for a route at home there.
fn cell_named_by_path(cells: Cells, home: Home, params: &PathParams) -> Option<Cell> {
    let named = match home {
        Home::NodeInPath => params.get("nodeId")?,
        Home::VmInPath => params.get("id")?,
        Home::Directory | Home::NodeInBody => return None,
    };
    Some(cells.home_of(named))
}

/// The cell of the node a VM's placement names in its body; none if the body names none (the
/// handler refuses it).
fn cell_named_by_body(cells: Cells, home: Home, body: &[u8]) -> Option<Cell> {
    if home != Home::NodeInBody {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(cells.home_of(value.get("nodeId")?.as_str()?))
}
