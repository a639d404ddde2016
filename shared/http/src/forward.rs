//! A write at an app that is not its home (docs/design.md, "Writes at home"): the whole
//! request sent to the home through Spin's outbound HTTP, and the home's answer given as it
//! came. The home runs the write beside the primaries; this app never writes to its copy.
//!
//! - **Nothing twice.** A POST goes with an `Idempotency-Key`: the caller's, or, when it sent
//!   none, a key of this app's own in `Forwarded-Write-Key`. When the home's answer is lost
//!   (the connection cut, no answer in time), the request is sent again with the same key, and
//!   the home replays what it did; PUT and DELETE are sent again as they are (they mean the
//!   same the second time). An own key is fresh, so the home looks it up only when it is sent
//!   again, records it only with a write (a refusal changed nothing, and is decided again),
//!   and never claims it across cells. A home out of reach every time is a 503
//!   `storage-unavailable`: the write was not done, or, if it was, the caller's retry with
//!   its key (or a read) finds it.
//! - **Never in a loop.** A forwarded request carries a tag only an app with the audit key
//!   can make, over the request's id: an app that is not home and receives one refuses it
//!   (508) instead of sending it on; a tag a client made is not one, and changes nothing.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use spin_sdk::http::{Method, Request, Response};
use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, IncomingResponse, Method as WasiMethod, OutgoingBody, OutgoingRequest,
    RequestOptions, Scheme,
};
use wasi::io::streams::StreamError;

use crate::auth::constant_time_eq;
use crate::execute::path_and_query;
use crate::problem::Problem;
use crate::routes::REQUEST_ID_HEADER;

/// The header that marks a request one app forwarded to its home: the forwarding app's request
/// id and the tag of it, its own key and its send (`<id>.<tag>`, [`tag`]).
pub const FORWARDED_HEADER: &str = "forwarded-write";
/// The forwarding app's own key for a POST the caller sent without one.
pub const OWN_KEY_HEADER: &str = "forwarded-write-key";
/// Present on a forwarded request sent again after its answer was lost.
pub const RESENT_HEADER: &str = "forwarded-write-resent";

/// The headers of a request the API reads, sent on to the home as they came.
const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "idempotency-key",
    "bookmark",
    "prefer",
    REQUEST_ID_HEADER,
];

/// Headers of the home's answer that belong to its connection, not to the answer.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "upgrade",
];

/// How many times a write is sent before the home is called out of reach.
pub const SENDS: usize = 3;

/// How long the home may take to answer a write before it is sent again.
const ANSWER_WITHIN_NS: u64 = 30_000_000_000;
const CONNECT_WITHIN_NS: u64 = 5_000_000_000;

/// Where writes run: the base URL of the home, from the `home_url` variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeApp {
    https: bool,
    authority: String,
}

impl HomeApp {
    /// The home named by `url` (`http://host:port`, a trailing slash allowed); `None` for an
    /// empty one: this app is home.
    pub fn parse(url: &str) -> Result<Option<HomeApp>, String> {
        let url = url.trim().trim_end_matches('/');
        if url.is_empty() {
            return Ok(None);
        }
        let (https, authority) = match url.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            _ => return Err(format!("{url:?} is not an http:// or https:// URL")),
        };
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(format!("{url:?} must be a scheme and a host, with no path"));
        }
        Ok(Some(HomeApp {
            https,
            authority: authority.to_owned(),
        }))
    }
}

/// The tag of a forwarded request: an HMAC under the audit key, which every app of the
/// deployment shares and no client has, of a label of its own (so a tag is never another
/// HMAC of the app's), the request id, the forwarding app's own key (if any) and whether it is
/// sent again.
pub fn tag(audit_key: &[u8], request_id: &str, own_key: Option<&str>, resent: bool) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(audit_key).expect("HMAC takes any key");
    mac.update(b"forwarded-write\n");
    mac.update(request_id.as_bytes());
    mac.update(b"\n");
    mac.update(own_key.unwrap_or_default().as_bytes());
    mac.update(if resent { b"\nresent" } else { b"\nfirst" });
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// How a request arrived from an app of this deployment that forwarded it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The forwarding app's own key, for a POST its caller sent without one.
    pub own_key: Option<String>,
    /// Whether it was sent again after its answer was lost.
    pub resent: bool,
}

/// How `request` was forwarded by an app of this deployment; `None` if it was not (or its
/// tag is not one an app made: a client's headers count for nothing here).
pub(crate) fn arrival(request: &Request, audit_key: &[u8]) -> Option<Arrival> {
    let (id, sent) = header(request, FORWARDED_HEADER)?.rsplit_once('.')?;
    let own_key = header(request, OWN_KEY_HEADER);
    let resent = request.header(RESENT_HEADER).is_some();
    let expected = tag(audit_key, id, own_key, resent);
    constant_time_eq(sent.as_bytes(), expected.as_bytes()).then(|| Arrival {
        own_key: own_key.map(str::to_owned),
        resent,
    })
}

fn header<'r>(request: &'r Request, name: &str) -> Option<&'r str> {
    request.header(name).and_then(|v| v.as_str())
}

/// The refusal of a forwarded request at an app that is not home: `home_url` points at
/// another app that forwards too.
pub(crate) fn loop_refused() -> Problem {
    Problem::new(
        508,
        "forwarding-loop",
        "Forwarding loop",
        "this request was forwarded to an app that is not the home of writes; its home_url must name the app beside the primaries",
    )
}

/// What a forwarded write was answered.
pub(crate) struct Forwarded {
    pub response: Response,
    /// The `Bookmark` the home answered with.
    pub bookmark: Option<String>,
    /// How many times it was sent.
    pub sends: usize,
}

/// Sends `request` (its `body` read) to `home` and gives back the home's answer.
pub(crate) fn forward(
    home: &HomeApp,
    request: &Request,
    body: &[u8],
    request_id: &str,
    audit_key: &[u8],
) -> Result<Forwarded, Problem> {
    let method = request.method();
    let own_key = (*method == Method::Post && header(request, "idempotency-key").is_none())
        .then(|| format!("forwarded-{}", crate::auth::random_hex(16)));
    let resend = own_key.is_some()
        || header(request, "idempotency-key").is_some()
        || matches!(method, Method::Put | Method::Delete);
    let path = path_and_query(request);
    let mut sends = 0;
    loop {
        sends += 1;
        let send = Send {
            path: &path,
            body,
            request_id,
            own_key: own_key.as_deref(),
            resent: sends > 1,
        };
        match send_once(home, request, &send, audit_key) {
            Ok((response, bookmark)) => {
                return Ok(Forwarded {
                    response,
                    bookmark,
                    sends,
                });
            }
            Err(sent) if sends < SENDS && (resend || !sent.reached_the_home) => {
                std::thread::sleep(std::time::Duration::from_millis(50 << sends));
            }
            Err(sent) => return Err(unreachable(&sent.error)),
        }
    }
}

/// A send that got no answer: whether the request may have reached the home.
struct Lost {
    reached_the_home: bool,
    error: String,
}

/// One sending of a forwarded request.
struct Send<'a> {
    path: &'a str,
    body: &'a [u8],
    request_id: &'a str,
    own_key: Option<&'a str>,
    resent: bool,
}

fn send_once(
    home: &HomeApp,
    request: &Request,
    send: &Send<'_>,
    audit_key: &[u8],
) -> Result<(Response, Option<String>), Lost> {
    let Send {
        path,
        body,
        request_id,
        own_key,
        resent,
    } = *send;
    let before_sending = |error: String| Lost {
        reached_the_home: false,
        error,
    };
    let after_sending = |error: String| Lost {
        reached_the_home: true,
        error,
    };
    let mut headers: Vec<(String, Vec<u8>)> = FORWARDED_REQUEST_HEADERS
        .iter()
        .filter_map(|name| Some((name.to_string(), header(request, name)?.as_bytes().to_vec())))
        .collect();
    if let Some(key) = own_key {
        headers.push((OWN_KEY_HEADER.to_owned(), key.as_bytes().to_vec()));
    }
    if resent {
        headers.push((RESENT_HEADER.to_owned(), b"1".to_vec()));
    }
    headers.push((
        FORWARDED_HEADER.to_owned(),
        format!(
            "{request_id}.{}",
            tag(audit_key, request_id, own_key, resent)
        )
        .into_bytes(),
    ));
    let fields = Fields::from_list(&headers).map_err(|e| before_sending(format!("{e:?}")))?;
    let outgoing = OutgoingRequest::new(fields);
    let set = |ok: Result<(), ()>, what: &str| ok.map_err(|()| before_sending(what.to_owned()));
    set(
        outgoing.set_method(&wasi_method(request.method())),
        "method",
    )?;
    let scheme = match home.https {
        true => Scheme::Https,
        false => Scheme::Http,
    };
    set(outgoing.set_scheme(Some(&scheme)), "scheme")?;
    set(outgoing.set_authority(Some(&home.authority)), "authority")?;
    set(outgoing.set_path_with_query(Some(path)), "path")?;
    let outgoing_body = outgoing
        .body()
        .map_err(|()| before_sending("the request body".to_owned()))?;
    let options = RequestOptions::new();
    let _ = options.set_connect_timeout(Some(CONNECT_WITHIN_NS));
    let _ = options.set_first_byte_timeout(Some(ANSWER_WITHIN_NS));
    let future = outgoing_handler::handle(outgoing, Some(options))
        .map_err(|e| before_sending(describe(&e)))?;
    {
        let stream = outgoing_body
            .write()
            .map_err(|()| before_sending("the request body stream".to_owned()))?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| after_sending(stream_error(e)))?;
        }
    }
    OutgoingBody::finish(outgoing_body, None).map_err(|e| after_sending(describe(&e)))?;
    future.subscribe().block();
    let incoming = match future.get() {
        Some(Ok(Ok(incoming))) => incoming,
        Some(Ok(Err(e))) => {
            let reached = !matches!(
                e,
                ErrorCode::ConnectionRefused
                    | ErrorCode::HttpRequestDenied
                    | ErrorCode::DnsError(_)
                    | ErrorCode::ConnectionTimeout
            );
            return Err(Lost {
                reached_the_home: reached,
                error: describe(&e),
            });
        }
        _ => return Err(after_sending("no answer".to_owned())),
    };
    // The replay of this app's own key is the caller's first answer.
    let drop_replayed = own_key.is_some();
    answer(incoming, drop_replayed).map_err(after_sending)
}

/// The home's answer as this app gives it: its status, its headers but the connection's (and
/// the mark of a replay, when `drop_replayed`), and its body read to the end; and its
/// `Bookmark`.
fn answer(
    incoming: IncomingResponse,
    drop_replayed: bool,
) -> Result<(Response, Option<String>), String> {
    let status = incoming.status();
    let headers = incoming.headers().entries();
    let body = incoming
        .consume()
        .map_err(|()| "the answer's body".to_owned())?;
    let mut bytes = Vec::new();
    {
        let stream = body
            .stream()
            .map_err(|()| "the answer's body stream".to_owned())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend(chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_error(e)),
            }
        }
    }
    drop(wasi::http::types::IncomingBody::finish(body));
    let mut response = Response::builder();
    response.status(status);
    let mut bookmark = None;
    for (name, value) in &headers {
        let name = name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(value);
        if name == crate::bookmark::BOOKMARK_HEADER {
            bookmark = Some(value.clone().into_owned());
        }
        let dropped = HOP_BY_HOP.contains(&name.as_str())
            || (drop_replayed && name == crate::execute::REPLAY_HEADER);
        if !dropped {
            response.header(name.as_str(), value.as_ref());
        }
    }
    Ok((response.body(bytes).build(), bookmark))
}

fn wasi_method(method: &Method) -> WasiMethod {
    match method {
        Method::Get => WasiMethod::Get,
        Method::Post => WasiMethod::Post,
        Method::Put => WasiMethod::Put,
        Method::Delete => WasiMethod::Delete,
        Method::Head => WasiMethod::Head,
        Method::Patch => WasiMethod::Patch,
        Method::Options => WasiMethod::Options,
        Method::Connect => WasiMethod::Connect,
        Method::Trace => WasiMethod::Trace,
        Method::Other(other) => WasiMethod::Other(other.clone()),
    }
}

fn describe(error: &ErrorCode) -> String {
    format!("{error:?}")
}

fn stream_error(error: StreamError) -> String {
    match error {
        StreamError::Closed => "the connection closed".to_owned(),
        StreamError::LastOperationFailed(e) => e.to_debug_string(),
    }
}

/// The answer when the home did not answer any send.
fn unreachable(error: &str) -> Problem {
    Problem::new(
        503,
        "storage-unavailable",
        "Storage unavailable",
        format!(
            "the home of writes did not answer ({error}); the write was not done here, and a retry with the same Idempotency-Key is safe"
        ),
    )
    .with_header("retry-after", "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_is_a_scheme_and_a_host() {
        assert_eq!(HomeApp::parse("").unwrap(), None);
        assert_eq!(HomeApp::parse("  ").unwrap(), None);
        let home = HomeApp::parse("http://home.internal:3000/")
            .unwrap()
            .unwrap();
        assert_eq!(home.authority, "home.internal:3000");
        for bad in [
            "home.internal",
            "ftp://h",
            "http://",
            "http://h/v1",
            "http://u@h",
        ] {
            assert!(HomeApp::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_tag_is_the_audit_keys_over_the_request_id_own_key_and_send() {
        let tagged = tag(b"key", "req-1", Some("k"), false);
        assert_eq!(tagged.len(), 32);
        for other in [
            tag(b"key", "req-2", Some("k"), false),
            tag(b"other key", "req-1", Some("k"), false),
            tag(b"key", "req-1", None, false),
            tag(b"key", "req-1", Some("j"), false),
            tag(b"key", "req-1", Some("k"), true),
        ] {
            assert_ne!(tagged, other);
        }
    }
}
