//! The one HTTP client of the app's end-to-end suites (`tests/api`) and the benchmark.
//!
//! - [`Client::send`] fails the test on a transport error; [`Client::try_send`] takes raw
//!   bytes and returns transport errors (a killed host, a client that gave up).
//! - OpenAPI mode, on unless [`Client::without_contract`]: every response to an operation of
//!   `docs/openapi.json` must have a documented status, the documented headers and content
//!   type, and a body valid against the documented schema ([`contract`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

pub mod contract;

pub use contract::{Contract, Undocumented};

/// How long a request may take unless a client says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Bodies above this size are sent with `Expect: 100-continue` (the smallest body limit,
/// 64 KiB, is above it).
pub const LARGE_BODY: usize = 32 * 1024;

fn agent_with(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

fn default_agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| agent_with(DEFAULT_TIMEOUT))
}

/// A caller of the API.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    headers: Vec<(String, http::HeaderValue)>,
    timeout: Option<Duration>,
    contract: Option<Arc<Contract>>,
    /// What a response to an operation the document does not describe is.
    undocumented: Undocumented,
    /// Several sites and the newest bookmark seen, shared by the clients of one session.
    session: Option<Arc<Session>>,
}

/// A client session over the sites of an edge deployment, as a D1 session is: requests go to
/// each site in turn, every one carries the newest `Bookmark` any answer of the session gave,
/// so that each is served from state at least as new as everything the session wrote.
#[derive(Debug)]
pub struct Session {
    bases: Vec<String>,
    next: AtomicUsize,
    bookmark: Mutex<Option<String>>,
}

impl Session {
    pub fn new(bases: Vec<String>) -> Arc<Session> {
        assert!(!bases.is_empty(), "a session needs a site");
        Arc::new(Session {
            bases,
            next: AtomicUsize::new(0),
            bookmark: Mutex::new(None),
        })
    }

    fn next_base(&self) -> &str {
        &self.bases[self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len()]
    }

    pub fn bookmark(&self) -> Option<String> {
        self.bookmark.lock().unwrap().clone()
    }

    /// Joins `seen` into the session's bookmark: a bookmark is a sealed position per cell
    /// (`p`, then each cell's `0` or `<position>-<tag>`, joined by dots), and an answer's
    /// covers the one its request sent, but answers to requests sent side by side may each
    /// cover what the other does not, so the session keeps each cell's newest, with its tag.
    fn saw(&self, seen: &str) {
        let mut bookmark = self.bookmark.lock().unwrap();
        *bookmark = Some(match bookmark.as_deref() {
            None => seen.to_owned(),
            Some(held) => join_bookmarks(held, seen),
        });
    }
}

/// Each cell's greater position of two bookmarks, with its own tag; `b` if either is not one.
fn join_bookmarks(a: &str, b: &str) -> String {
    let cells = |text: &str| -> Option<Vec<(u64, String)>> {
        text.strip_prefix('p')?
            .split('.')
            .map(|part| {
                let number = part.split('-').next()?;
                Some((number.parse().ok()?, part.to_owned()))
            })
            .collect()
    };
    let (Some(a), Some(b)) = (cells(a), cells(b)) else {
        return b.to_owned();
    };
    let start = (0, "0".to_owned());
    let joined: Vec<String> = (0..a.len().max(b.len()))
        .map(|i| {
            let (x, y) = (a.get(i).unwrap_or(&start), b.get(i).unwrap_or(&start));
            if x.0 >= y.0 { x.1.clone() } else { y.1.clone() }
        })
        .collect();
    format!("p{}", joined.join("."))
}

impl Client {
    /// A caller at `base` (`http://host:port`), with a bearer token or none, whose responses
    /// are checked against the OpenAPI document.
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client {
            base: base.to_owned(),
            token,
            headers: Vec::new(),
            timeout: None,
            contract: Some(Contract::shared()),
            undocumented: Undocumented::Skip,
            session: None,
        }
    }

    /// A caller in `session`: each request to the session's next site, with its bookmark.
    pub fn in_session(session: &Arc<Session>, token: Option<String>) -> Client {
        let mut client = Client::new(&session.bases[0], token);
        client.session = Some(session.clone());
        client
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same caller, sending an extra header on every request.
    pub fn with_header(&self, name: &str, value: &str) -> Client {
        self.with_raw_header(name, value.as_bytes())
            .unwrap_or_else(|e| panic!("header {name}: {e}"))
    }

    /// The same caller, sending an extra header of any bytes HTTP allows in one.
    pub fn with_raw_header(&self, name: &str, value: &[u8]) -> Result<Client, String> {
        let value = http::HeaderValue::from_bytes(value).map_err(|e| e.to_string())?;
        let mut client = self.clone();
        client.headers.push((name.to_owned(), value));
        Ok(client)
    }

    /// The same caller with a raw `Authorization` header value instead of its token.
    pub fn with_authorization(&self, value: &str) -> Client {
        let mut client = self.clone();
        client.token = None;
        client.with_header("authorization", value)
    }

    /// The same caller, giving up on an answer after `timeout`.
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        let mut client = self.clone();
        client.timeout = Some(timeout);
        client
    }

    /// The same caller, checking responses against `contract` (to count what one test saw).
    pub fn with_contract(&self, contract: Arc<Contract>) -> Client {
        let mut client = self.clone();
        client.contract = Some(contract);
        client
    }

    /// The same caller, checking responses against `contract` and failing on any operation
    /// the document does not describe (for a caller that sends only documented ones).
    pub fn with_strict_contract(&self, contract: Arc<Contract>) -> Client {
        let mut client = self.with_contract(contract);
        client.undocumented = Undocumented::Fail;
        client
    }

    /// The same caller, not checking responses against the document (for load generators,
    /// whose cost must be the server's).
    pub fn without_contract(&self) -> Client {
        let mut client = self.clone();
        client.contract = None;
        client
    }

    /// Sends a request with a raw body and content type (`None`: no content type); a
    /// transport error fails the test, as does a response the document disowns.
    #[track_caller]
    pub fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> Reply {
        self.try_send(method, path, content_type, body)
            .unwrap_or_else(|e| panic!("{method} {}{path}: {e}", self.base))
    }

    /// Sends a request; a transport error (no answer, a body cut off) is returned. A response
    /// the document disowns still fails the test.
    #[track_caller]
    pub fn try_send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> Result<Reply, String> {
        let reply = self.transport(method, path, content_type, body)?;
        if let Some(contract) = &self.contract
            && let Err(violation) = contract.check(method, path, &reply, self.undocumented)
        {
            panic!("the response breaks the OpenAPI document: {violation}");
        }
        Ok(reply)
    }

    fn transport(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> Result<Reply, String> {
        let base = match &self.session {
            Some(session) => session.next_base(),
            None => &self.base,
        };
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"));
        if let Some(bookmark) = self.session.as_ref().and_then(|s| s.bookmark()) {
            builder = builder.header("bookmark", bookmark);
        }
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
            return send_expecting_continue(base, builder, body);
        }
        let dedicated;
        let agent = match self.timeout {
            Some(timeout) => {
                dedicated = agent_with(timeout);
                &dedicated
            }
            None => default_agent(),
        };
        let result = match body {
            Some(body) => agent.run(builder.body(body.to_vec()).map_err(|e| e.to_string())?),
            None => agent.run(builder.body(()).map_err(|e| e.to_string())?),
        };
        let mut response = result.map_err(|e| format!("no answer: {e}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        if let (Some(session), Some(bookmark)) = (&self.session, headers.get("bookmark"))
            && let Ok(bookmark) = bookmark.to_str()
        {
            session.saw(bookmark);
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .map_err(|e| format!("body cut off: {e}"))?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    #[track_caller]
    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, None)
    }

    #[track_caller]
    pub fn delete(&self, path: &str) -> Reply {
        self.send("DELETE", path, None, None)
    }

    #[track_caller]
    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "POST",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )
    }

    #[track_caller]
    pub fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "PUT",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )
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
}

/// Sends a large body as curl does: `Expect: 100-continue`, and the body only once the
/// server asks for it. The app refuses an oversized or unauthenticated body without
/// reading it, and a client still pushing megabytes at a server that has answered and
/// closed would lose the answer to a connection reset.
pub fn send_expecting_continue(
    base: &str,
    request: http::request::Builder,
    body: &[u8],
) -> Result<Reply, String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| format!("{what}: {e}")
    };
    let request = request.body(()).map_err(|e| e.to_string())?;
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).map_err(io("connect"))?;
    stream
        .set_read_timeout(Some(DEFAULT_TIMEOUT))
        .map_err(io("timeout"))?;
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
            value.to_str().map_err(|e| e.to_string())?
        ));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(io("send the head"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(io("clone the stream"))?);
    let read_head = |reader: &mut BufReader<std::net::TcpStream>| -> Result<Vec<String>, String> {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .map_err(io("read the response head"))?;
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                return Ok(lines);
            }
            lines.push(line);
        }
    };
    let mut lines = read_head(&mut reader)?;
    if lines.first().is_some_and(|l| l.starts_with("HTTP/1.1 100")) {
        stream.write_all(body).map_err(io("send the body"))?;
        lines = read_head(&mut reader)?;
    }
    let status: u16 = lines
        .first()
        .and_then(|l| l.get(9..12))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {lines:?}"))?;
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
        .map_err(io("read the response body"))?;
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    Ok(Reply {
        status,
        headers,
        body: if chunked { dechunk(&raw) } else { raw },
    })
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
