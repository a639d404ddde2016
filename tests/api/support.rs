//! The harness of the end-to-end suites: the real `spin.toml` with the built `.wasm`
//! components, served by the project's host over real HTTP on an ephemeral port, with its
//! state in fresh SQLite files, or with `TEST_STORES=sqld-redis` on a fresh sqld and Redis of
//! its own ([`crate::stores`]). Fixtures are made through the API itself.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};
use spin_host::{Host, HostConfig, TimeDelta};

// The temp dirs and the workspace path of the host's own suites serve these too.
pub use crate::common::{TempDir, workspace};
use crate::stores::{RemoteStores, remote_by_default};

pub const OPERATOR_TOKEN: &str = "test-operator-token-0123456789abcdef";
/// The secret that keys the audit chain in every test app.
pub const AUDIT_KEY: &str = "test-audit-key-fedcba9876543210";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// Makes sure every component of spin.toml is built (the test command builds them first;
/// this only covers a bare `cargo test`).
pub fn ensure_components_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let manifest = std::fs::read_to_string(workspace().join("spin.toml")).expect("spin.toml");
        let missing = manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("source = \""))
            .map(|s| s.trim_end_matches('"'))
            .any(|source| !workspace().join(source).is_file());
        if missing {
            let status = Command::new("bash")
                .arg(workspace().join("scripts/build-wasm"))
                .status()
                .expect("run scripts/build-wasm");
            assert!(status.success(), "building the components failed");
        }
        let _ = target_dir();
    });
}

/// The app, running.
pub struct App {
    host: Host,
    /// Its own sqld and Redis, with `TEST_STORES=sqld-redis`.
    stores: Option<RemoteStores>,
    db_path: PathBuf,
    state: TempDir,
    pub base: String,
}

impl App {
    pub fn start() -> App {
        App::start_with(|config| config)
    }

    /// Starts with a tweaked host config (e.g. no operator token).
    pub fn start_with(tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let state = TempDir::new("state");
        let stores = remote_by_default().then(|| RemoteStores::start(&state.path().join("stores")));
        let mut app = App::start_in(state, stores.as_ref(), tweak);
        app.stores = stores;
        app
    }

    /// Starts on `stores`, which the caller keeps (replicas share them).
    pub fn start_on(stores: &RemoteStores) -> App {
        App::start_in(TempDir::new("state"), Some(stores), |config| config)
    }

    fn start_in(
        state: TempDir,
        stores: Option<&RemoteStores>,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> App {
        ensure_components_built();
        let mut config = HostConfig::new(workspace().join("spin.toml"))
            .state_dir(state.path())
            .env("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("SPIN_VARIABLE_AUDIT_KEY", AUDIT_KEY);
        let db_path = match stores {
            Some(stores) => {
                config = config.runtime_config(stores.runtime_config());
                stores.sqld.data_path()
            }
            None => state.path().join("sqlite_db.db"),
        };
        let mut config = tweak(config);
        config.log_requests = false;
        config.print_banner = false;
        let host = Host::start(config).expect("the app starts");
        let base = host.base_url();
        App {
            host,
            stores: None,
            db_path,
            state,
            base,
        }
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The file of the app's database: in the state directory, or sqld's.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Every key and value of the app's own Redis, when it has one.
    pub fn redis_dump(&self) -> Option<Vec<String>> {
        self.stores.as_ref().map(|stores| stores.redis.dump())
    }

    /// The app's SQLite database, opened directly, to check state behind the API.
    pub fn db(&self) -> rusqlite::Connection {
        let connection = rusqlite::Connection::open(&self.db_path).expect("open db");
        connection
            .busy_timeout(std::time::Duration::from_secs(10))
            .expect("busy timeout");
        connection
    }

    /// Moves the components' clock `seconds` from the real one (never sleep for a term).
    pub fn set_clock_offset_secs(&self, seconds: i64) {
        self.host.set_clock_offset(TimeDelta::seconds(seconds));
    }

    pub fn operator(&self) -> Client {
        Client::new(&self.base, Some(OPERATOR_TOKEN.to_owned()))
    }

    pub fn anonymous(&self) -> Client {
        Client::new(&self.base, None)
    }

    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.base, Some(token.to_owned()))
    }

    // ---------------------------------------------------------------- fixtures

    pub fn org(&self, id: &str) {
        self.operator()
            .post(
                "/v1/orgs",
                &json!({ "id": id, "name": format!("Org {id}") }),
            )
            .expect_status(201);
    }

    /// A key of `org` with `role` (and optionally an explicit permission list).
    pub fn key(&self, org: &str, role: &str, permissions: Option<&[&str]>) -> Client {
        let mut body = json!({ "name": format!("{role} key"), "role": role });
        if let Some(list) = permissions {
            body["permissions"] = json!(list);
        }
        let created = self
            .operator()
            .post(&format!("/v1/orgs/{org}/keys"), &body)
            .expect_status(201)
            .json();
        self.client(created["token"].as_str().expect("token"))
    }

    pub fn node(&self, id: &str, owner: &str, units: &[&str]) -> Value {
        self.operator()
            .put(
                &format!("/v1/nodes/{id}"),
                &json!({ "ownerOrgId": owner, "unitIds": units }),
            )
            .expect_status(201)
            .json()
    }

    /// An active, open-ended reservation (started an hour ago) made by the operator.
    pub fn reservation(
        &self,
        node: &str,
        units: &[&str],
        audience: &[&str],
        managers: &[&str],
    ) -> Value {
        self.reservation_starting(node, units, audience, managers, -3600)
    }

    /// An open-ended reservation made by the operator, starting `seconds` from now
    /// (negative: already active).
    pub fn reservation_starting(
        &self,
        node: &str,
        units: &[&str],
        audience: &[&str],
        managers: &[&str],
        seconds: i64,
    ) -> Value {
        self.operator()
            .post(
                &format!("/v1/nodes/{node}/reservations"),
                &json!({
                    "reservedUnitIds": units,
                    "allowedOrgIds": audience,
                    "managingOrgIds": managers,
                    "startsAt": rfc3339_from_now(seconds),
                }),
            )
            .expect_status(201)
            .json()
    }
}

/// An RFC 3339 time `seconds` from the real now.
pub fn rfc3339_from_now(seconds: i64) -> String {
    (chrono::Utc::now() + TimeDelta::seconds(seconds))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A caller of the API.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    headers: Vec<(String, String)>,
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(120)))
            .build();
        ureq::Agent::new_with_config(config)
    })
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client {
            base: base.to_owned(),
            token,
            headers: Vec::new(),
        }
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same caller, sending an extra header on every request.
    pub fn with_header(&self, name: &str, value: &str) -> Client {
        let mut client = self.clone();
        client.headers.push((name.to_owned(), value.to_owned()));
        client
    }

    /// The same caller with a raw `Authorization` header value.
    pub fn with_authorization(&self, value: &str) -> Client {
        let mut client = Client::new(&self.base, None);
        client
            .headers
            .push(("authorization".into(), value.to_owned()));
        client
    }

    /// Sends a request with a raw body and content type (`None`: no content type).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> Reply {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        if let Some(token) = &self.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        if let Some(body) = body.filter(|body| body.len() > LARGE_BODY) {
            return send_expecting_continue(&self.base, builder, body);
        }
        let result = match body {
            Some(body) => agent().run(builder.body(body.to_vec()).expect("request")),
            None => agent().run(builder.body(()).expect("request")),
        };
        let mut response = result.expect("HTTP request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .expect("read body");
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, None)
    }

    /// Every item of a paginated listing (`path` with its query), following `nextCursor`
    /// to the end.
    pub fn all_items(&self, path: &str) -> Vec<Value> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                Some(cursor) => format!("{path}&cursor={cursor}"),
                None => path.to_owned(),
            };
            let page = self.get(&page_path).expect_status(200).json();
            items.extend(page["items"].as_array().expect("items").iter().cloned());
            match page["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return items,
            }
        }
    }

    pub fn delete(&self, path: &str) -> Reply {
        self.send("DELETE", path, None, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "POST",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )
    }

    pub fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "PUT",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )
    }
}

/// Bodies above this size are sent with `Expect: 100-continue` (the smallest body limit,
/// 64 KiB, is above it).
pub const LARGE_BODY: usize = 32 * 1024;

/// Sends a large body as curl does: `Expect: 100-continue`, and the body only once the
/// server asks for it. The app refuses an oversized or unauthenticated body without
/// reading it, and a client still pushing megabytes at a server that has answered and
/// closed would lose the answer to a connection reset.
pub fn send_expecting_continue(base: &str, request: http::request::Builder, body: &[u8]) -> Reply {
    use std::io::{BufRead, BufReader, Read, Write};
    let request = request.body(()).expect("request");
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .expect("timeout");
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {address}\r\ncontent-length: {}\r\n\
         expect: 100-continue\r\nconnection: close\r\n",
        request.method(),
        request.uri().path_and_query().expect("a path"),
        body.len()
    );
    for (name, value) in request.headers() {
        head.push_str(&format!(
            "{name}: {}\r\n",
            value.to_str().expect("a text header")
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send the head");
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let read_head = |reader: &mut BufReader<std::net::TcpStream>| {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("read the response head");
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                break lines;
            }
            lines.push(line);
        }
    };
    let mut lines = read_head(&mut reader);
    if lines[0].starts_with("HTTP/1.1 100") {
        stream.write_all(body).expect("send the body");
        lines = read_head(&mut reader);
    }
    let status: u16 = lines[0][9..12].parse().expect("a status code");
    let mut headers = http::HeaderMap::new();
    for line in &lines[1..] {
        let (name, value) = line.split_once(':').expect("a header line");
        headers.append(
            http::HeaderName::from_bytes(name.trim().as_bytes()).expect("a header name"),
            http::HeaderValue::from_str(value.trim()).expect("a header value"),
        );
    }
    let mut raw = Vec::new();
    reader
        .read_to_end(&mut raw)
        .expect("read the response body");
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    Reply {
        status,
        headers,
        body: if chunked { dechunk(&raw) } else { raw },
    }
}

/// The payload of a chunked transfer encoding.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size_text = std::str::from_utf8(&raw[..line_end]).expect("a chunk size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("a hex chunk size");
        raw = &raw[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts the status, showing the body when it differs.
    #[track_caller]
    pub fn expect_status(self, status: u16) -> Reply {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        self
    }

    /// Asserts a 201 and returns the created object's `id` (VM ids, for one, are the
    /// server's to choose).
    #[track_caller]
    pub fn created_id(self) -> String {
        let body = self.expect_status(201).json();
        body["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id: {body}"))
            .to_owned()
    }

    /// Asserts an RFC 9457 problem with this status and code; returns the document.
    #[track_caller]
    pub fn expect_problem(self, status: u16, code: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "problem content type; body: {}",
            self.text()
        );
        let problem = self.json();
        assert_eq!(problem["code"], code, "problem code; body: {problem}");
        assert_eq!(problem["status"], status, "problem status member");
        for member in ["type", "title", "detail", "requestId"] {
            assert!(
                problem[member].is_string(),
                "problem lacks {member}: {problem}"
            );
        }
        assert_eq!(
            self.header("x-request-id"),
            problem["requestId"].as_str(),
            "the request id header and member agree"
        );
        problem
    }
}

/// Sorted strings of a JSON array, for order-insensitive comparisons.
pub fn strings(value: &Value) -> Vec<String> {
    let mut list: Vec<String> = value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().expect("string").to_owned())
        .collect();
    list.sort();
    list
}

/// The HTTP methods a component router may register.
pub const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

/// The component that serves the capacity console: an HTML page and its assets, public,
/// reading no state, and the only routes outside the JSON API's `/v1/`.
pub const CONSOLE_COMPONENT: &str = "console";

/// `(METHOD, route)` pairs the app serves: spin.toml's routes, each with the methods its
/// component's router registers for it. Every router path must be one of its component's
/// spin.toml routes, and every spin.toml route must have a router method, so the suites that
/// enumerate routes (the OpenAPI check, the authorization sweep) cannot miss a new one.
/// A router's trailing wildcard `/x/*` serves spin.toml's `/x/...`. Only the console serves
/// routes outside `/v1/`.
pub fn served_routes() -> BTreeSet<(String, String)> {
    let manifest: toml::Table = std::fs::read_to_string(workspace().join("spin.toml"))
        .expect("spin.toml")
        .parse()
        .expect("spin.toml parses");
    let mut routes_by_component: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for trigger in manifest["trigger"]["http"]
        .as_array()
        .expect("[[trigger.http]]")
    {
        routes_by_component
            .entry(trigger["component"].as_str().expect("component").to_owned())
            .or_default()
            .insert(trigger["route"].as_str().expect("route").to_owned());
    }
    let mut served = BTreeSet::new();
    for (component, routes) in &routes_by_component {
        let source_path = workspace().join(format!("functions/{component}/src/lib.rs"));
        let source = std::fs::read_to_string(&source_path)
            .unwrap_or_else(|e| panic!("{}: {e}", source_path.display()));
        let mut routed = BTreeSet::new();
        for (method, path) in router_calls(&source) {
            let path = match path.strip_suffix("/*") {
                Some(prefix) => format!("{prefix}/..."),
                None => path,
            };
            assert!(
                path.starts_with("/v1/") || component == CONSOLE_COMPONENT,
                "component {component} serves {path}, outside the API's /v1/"
            );
            assert!(
                routes.contains(&path),
                "component {component} routes {method} {path}, which spin.toml does not send it"
            );
            routed.insert(path.clone());
            served.insert((method, path));
        }
        for route in routes {
            assert!(
                routed.contains(route),
                "spin.toml sends {route} to {component}, whose router has no method for it"
            );
        }
    }
    served
}

/// The JSON API's `(METHOD, route)` pairs: what the OpenAPI document describes. The other
/// served routes are the console's page and assets ([`CONSOLE_COMPONENT`]), covered by the
/// authorization sweep and, in a browser, by `scripts/console-test`.
pub fn api_routes() -> BTreeSet<(String, String)> {
    served_routes()
        .into_iter()
        .filter(|(_, route)| route.starts_with("/v1/"))
        .collect()
}

/// `router.<method>("<path>", …)` calls in a component's source.
fn router_calls(source: &str) -> Vec<(String, String)> {
    let mut calls = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("router.") {
        rest = &rest[at + "router.".len()..];
        let method: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(arguments) = rest[method.len()..].trim_start().strip_prefix('(') else {
            continue;
        };
        let Some(literal) = arguments.trim_start().strip_prefix('"') else {
            continue;
        };
        let path = &literal[..literal.find('"').expect("a closed string literal")];
        assert!(
            METHODS.contains(&method.as_str()),
            "router.{method}(\"{path}\"): register explicit methods so every route can be enumerated"
        );
        calls.push((method.to_ascii_uppercase(), path.to_owned()));
    }
    calls
}
