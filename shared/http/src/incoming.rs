//! The request as it arrives: what is read from its head before its body (its ids,
//! single-valued headers, a declared length over the endpoint's limit), and its body only
//! when an endpoint asks for it — after authentication, up to the endpoint's size limit,
//! within a deadline.
//!
//! Spin SDK's own `Request` reads the whole body before the component sees anything, so a
//! stranger without a token could make the server hold any number of bytes, for as long as
//! they care to send them. Here the component's handler parameter ([`Incoming`]) carries the
//! head (a `Request` with an empty body) and the [`UnreadBody`] beside it, which the endpoint
//! reads with [`UnreadBody::read`] once the caller is known (or never, and it is dropped).

use std::future::Future;
use std::pin::Pin;

// The wasi:http body type; spin-sdk names it only in its (public, undocumented) bindings.
use spin_sdk::http::conversions::TryFromIncomingRequest;
use spin_sdk::http::{IncomingRequest, IntoResponse, Request, Response};
use spin_sdk::wit::wasi::http0_2_0::types::IncomingBody;
use wasi::clocks::monotonic_clock;
use wasi::io::poll;
use wasi::io::streams::StreamError;

use crate::problem::Problem;
use crate::response::problem_response;

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
/// component's handler, split once by [`crate::dispatch::serve`] and the body handed on to
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
