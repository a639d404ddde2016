//! The HTTP server: hyper HTTP/1.1, one fresh component instance per request.
//!
//! Each request is routed (see [`crate::routes`]); no match is Spin's 404: no body, no
//! headers of its own. A match gets its `spin-*` headers (see [`crate::headers`]), a new
//! [`wasmtime::Store`] and an instance of the component's pre-instantiated
//! `wasi:http/incoming-handler`. A component that traps or never answers is Spin's 500: no
//! body.
//!
//! Before a routed request reaches the component, two checks of Spin's trigger
//! (`crates/trigger-http`): a `Host` header that is not UTF-8 or not an authority (or none, and
//! no authority in the URI, or one that disagrees with it) fails the request, so hyper closes
//! the connection without an answer (`set_req_uri`); any other header value that is not UTF-8
//! is a 500 with no body, as Spin hands the component its headers as strings
//! (`prepare_request_headers`).
//!
//! Each request is served inside a server span, and the component runs inside a span of its
//! own, named as Spin names them (see [`crate::telemetry`]).
//!
//! One line per request is printed to stdout, once the component has finished: method,
//! path, component, status, duration, and the SQLite statements it ran, all and those
//! inside a write transaction:
//!
//! ```text
//! POST /v1/nodes/n1/reservations/r1/release release 200 1.234ms statements=11 in_write_tx=9
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::header::{CONNECTION, HOST, HeaderMap, HeaderName};
use http::uri::Authority;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::HostConfig;
use crate::app::{App, AppComponent};
use crate::headers;
use crate::routes::RouteMatch;
use crate::sqlite::{StatementCounter, StatementCounts};
use crate::telemetry;

/// A running server on the current tokio runtime.
pub struct Server {
    addr: SocketAddr,
    app: Arc<App>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Loads the app (compiling on a blocking thread) and starts listening.
    pub async fn start(config: HostConfig) -> anyhow::Result<Self> {
        let config = config.resolve();
        let load_config = config.clone();
        let app = tokio::task::spawn_blocking(move || App::load(&load_config))
            .await
            .context("loading the app panicked")??;
        Self::serve(app, &config).await
    }

    /// Starts listening for an already loaded app.
    pub async fn serve(app: App, config: &HostConfig) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let addr = listener.local_addr()?;
        let app = Arc::new(app);
        let (shutdown, receiver) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            listener,
            app.clone(),
            receiver,
            config.log_requests,
        ));
        if config.print_banner {
            println!("{}", banner(&app, addr));
        }
        Ok(Self {
            addr,
            app,
            shutdown,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn app(&self) -> &App {
        &self.app
    }

    /// Stops accepting, lets in-flight requests finish (up to 5 s), returns.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Serves until the task ends (it does not, unless shut down).
    pub async fn wait(mut self) {
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// What `spin up` prints once it listens.
fn banner(app: &App, addr: SocketAddr) -> String {
    let base = format!("http://{addr}");
    let mut out = format!("Serving {base}\nAvailable Routes:");
    for (route, component) in app.router.routes() {
        out.push_str(&format!("\n  {component}: {base}{route}"));
    }
    out
}

async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    mut shutdown: watch::Receiver<bool>,
    log: bool,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, client) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                eprintln!("Error: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let mut conn_shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let app = app.clone();
                async move { handle(&app, req, client, log).await }
            });
            let conn = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = conn_shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

/// Answers one request inside its server span, as Spin's trigger does
/// (`spin_trigger_http.handle_http_request`, named `<method> <route>` once routed); an error
/// makes hyper close the connection without answering.
async fn handle(
    app: &App,
    req: Request<Incoming>,
    client: SocketAddr,
    log: bool,
) -> anyhow::Result<Response<HyperOutgoingBody>> {
    use opentelemetry_semantic_conventions::attribute as otel;
    let span = tracing::info_span!(
        "spin_trigger_http.handle_http_request",
        "otel.kind" = "server",
        { otel::HTTP_REQUEST_METHOD } = %req.method(),
        { otel::NETWORK_PEER_ADDRESS } = %client.ip(),
        { otel::NETWORK_PEER_PORT } = %client.port(),
        { otel::NETWORK_PROTOCOL_NAME } = "http",
        { otel::URL_PATH } = req.uri().path(),
        { otel::URL_QUERY } = req.uri().query().unwrap_or(""),
        { otel::URL_SCHEME } = req.uri().scheme_str().unwrap_or(""),
        { otel::CLIENT_ADDRESS } = req.headers().get("x-forwarded-for").and_then(|v| v.to_str().ok()),
        { otel::ERROR_TYPE } = tracing::field::Empty,
        { otel::HTTP_RESPONSE_STATUS_CODE } = tracing::field::Empty,
        { otel::HTTP_ROUTE } = tracing::field::Empty,
        "otel.name" = tracing::field::Empty,
    );
    let method = req.method().to_string();
    async move {
        telemetry::extract_trace_context(req.headers());
        let result = respond(app, req, client, log).await;
        let span = tracing::Span::current();
        match &result {
            Ok(response) => {
                match response.extensions().get::<MatchedRoute>() {
                    Some(MatchedRoute(route)) => {
                        span.record(otel::HTTP_ROUTE, route.as_str());
                        span.record("otel.name", format!("{method} {route}"));
                    }
                    None => {
                        span.record("otel.name", method.as_str());
                    }
                }
                span.record(otel::HTTP_RESPONSE_STATUS_CODE, response.status().as_u16());
            }
            Err(e) => {
                span.record(otel::ERROR_TYPE, format!("{e:?}"));
                span.record(otel::HTTP_RESPONSE_STATUS_CODE, 500);
                span.record("otel.name", method.as_str());
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// The route a response answered, as the manifest writes it (the server span's `http.route`).
#[derive(Clone)]
struct MatchedRoute(String);

fn matched(mut response: Response<HyperOutgoingBody>, route: &str) -> Response<HyperOutgoingBody> {
    response
        .extensions_mut()
        .insert(MatchedRoute(route.to_string()));
    response
}

/// Answers one request: Spin's own paths, 404 for no route, else the routed component.
async fn respond(
    app: &App,
    mut req: Request<Incoming>,
    client: SocketAddr,
    log: bool,
) -> anyhow::Result<Response<HyperOutgoingBody>> {
    // Transport information for this server alone: Spin removes it before anything else
    // (`strip_forbidden_headers`), so the component never sees it, nor is its value checked.
    req.headers_mut().remove(CONNECTION);
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let line = RequestLine {
        method,
        path,
        start,
        log,
    };
    if let Some(response) = well_known(app, &line.path) {
        line.print("-", response.status(), None);
        return Ok(matched(response, &line.path));
    }
    let Some(route) = app.router.route(&line.path) else {
        let response = not_found();
        line.print("-", response.status(), None);
        return Ok(response);
    };
    let authority = authority(&req).inspect_err(|e| {
        eprintln!(
            "Error: {} {}: {e:#}; closing the connection",
            line.method, line.path
        )
    })?;
    if let Some(name) = non_utf8_header(req.headers()) {
        eprintln!(
            "Error: {} {}: the value of header `{name}` is not UTF-8",
            line.method, line.path
        );
        let response = internal_error();
        line.print(&route.component, response.status(), None);
        return Ok(matched(response, &route.raw_route));
    }
    let component = &app.components[&route.component];
    telemetry::metrics::request(&app.manifest.name, &component.id);
    let statements = Arc::new(StatementCounter::default());
    match execute(
        app,
        component,
        &route,
        req,
        authority,
        client,
        statements.clone(),
    )
    .await
    {
        Ok((response, task)) => {
            let id = component.id.clone();
            let status = response.status();
            // The guest may keep running to stream the body: report its end, then the line.
            tokio::spawn(async move {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!(
                        "Error: component `{id}` failed after sending its response: {e:?}"
                    ),
                    Err(e) => eprintln!("Error: component `{id}` task failed: {e}"),
                }
                line.print(&id, status, Some(statements.get()));
            });
            Ok(matched(response, &route.raw_route))
        }
        Err(e) => {
            eprintln!(
                "Error: component `{}` failed on {} {}: {e:#}",
                route.component, line.method, line.path
            );
            let response = internal_error();
            line.print(&route.component, response.status(), Some(statements.get()));
            Ok(matched(response, &route.raw_route))
        }
    }
}

/// The request's authority as Spin takes it (`set_req_uri`): from the `Host` header, which
/// must be UTF-8 and an authority, else from the URI; if both are there they must agree.
fn authority(req: &Request<Incoming>) -> anyhow::Result<Authority> {
    let host = match req.headers().get(HOST) {
        Some(value) => Some(
            value
                .to_str()
                .context("the Host header is not UTF-8")?
                .parse::<Authority>()
                .context("the Host header is not an authority")?,
        ),
        None => None,
    };
    match (host, req.uri().authority()) {
        (Some(host), None) => Ok(host),
        (None, Some(uri)) => Ok(uri.clone()),
        (Some(host), Some(uri)) if host == *uri => Ok(host),
        (Some(_), Some(_)) => bail!("the Host header and the URI name different authorities"),
        (None, None) => bail!("no Host header and no authority in the URI"),
    }
}

/// The first header whose value is not UTF-8, which Spin will not pass to a component.
fn non_utf8_header(headers: &HeaderMap) -> Option<&HeaderName> {
    headers
        .iter()
        .find(|(_, value)| std::str::from_utf8(value.as_bytes()).is_err())
        .map(|(name, _)| name)
}

/// What the request log says about one request.
struct RequestLine {
    method: http::Method,
    path: String,
    start: Instant,
    log: bool,
}

impl RequestLine {
    fn print(&self, component: &str, status: StatusCode, statements: Option<StatementCounts>) {
        if !self.log {
            return;
        }
        let sql = statements
            .map(|s| {
                format!(
                    " statements={} in_write_tx={}",
                    s.statements, s.in_write_transaction
                )
            })
            .unwrap_or_default();
        println!(
            "{} {} {component} {} {:.3}ms{sql}",
            self.method,
            self.path,
            status.as_u16(),
            self.start.elapsed().as_secs_f64() * 1000.0
        );
    }
}

/// A component's run, going on after its response.
type GuestTask = JoinHandle<wasmtime::Result<()>>;

async fn execute(
    app: &App,
    component: &AppComponent,
    route: &RouteMatch,
    req: Request<Incoming>,
    authority: Authority,
    client: SocketAddr,
    statements: Arc<StatementCounter>,
) -> anyhow::Result<(Response<HyperOutgoingBody>, GuestTask)> {
    let (mut parts, body) = req.into_parts();
    headers::prepare(&mut parts.headers, &parts.uri, route, client);
    // wasi:http takes the authority from the URI once `Host` is gone.
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path_and_query)
        .build()
        .context("invalid request URI")?;

    let mut store = app.new_store(component, statements);
    let request = store
        .data_mut()
        .http()
        .new_incoming_request(Scheme::Http, Request::from_parts(parts, body))?;
    let (sender, receiver) = oneshot::channel();
    let response_out = store.data_mut().http().new_response_outparam(sender)?;
    let pre = component.pre.clone();
    let span = tracing::info_span!(
        "spin_trigger_http.execute_wasm",
        "otel.name" = format!("execute_wasm_component {}", component.id),
    );
    let task = tokio::spawn(
        async move {
            let proxy = pre.instantiate_async(&mut store).await?;
            store.data_mut().usage.initialised();
            let handled = proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, request, response_out)
                .await;
            store.data().usage.report();
            handled
        }
        .instrument(span),
    );

    match receiver.await {
        Ok(Ok(response)) => Ok((response, task)),
        Ok(Err(code)) => {
            task.abort();
            Err(anyhow!("the component answered with error code {code:?}"))
        }
        Err(_) => match task.await {
            Ok(Ok(())) => Err(anyhow!("the component returned without setting a response")),
            Ok(Err(e)) => Err(anyhow::Error::from(e)),
            Err(e) => Err(anyhow!("the component task failed: {e}")),
        },
    }
}

fn body(bytes: impl Into<Bytes>) -> HyperOutgoingBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn response(status: StatusCode, content_type: &str, text: String) -> Response<HyperOutgoingBody> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(body(text))
        .expect("valid response")
}

/// Spin's answer to a path no route matches: 404, nothing else.
fn not_found() -> Response<HyperOutgoingBody> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(body(Bytes::new()))
        .expect("valid response")
}

/// Spin's answer when a routed request fails before or inside the component: 500, no body.
fn internal_error() -> Response<HyperOutgoingBody> {
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .body(body(Bytes::new()))
        .expect("valid response")
}

/// Spin answers `/.well-known/spin/…` itself, whatever the app's routes.
fn well_known(app: &App, path: &str) -> Option<Response<HyperOutgoingBody>> {
    match path.strip_prefix("/.well-known/spin/")? {
        "health" => Some(response(StatusCode::OK, "text/plain", "OK".to_string())),
        "info" => {
            let info = serde_json::json!({
                "name": app.manifest.name,
                "version": app.manifest.version,
                "host": "spin-host",
            });
            Some(response(
                StatusCode::OK,
                "application/json",
                info.to_string(),
            ))
        }
        _ => Some(not_found()),
    }
}
