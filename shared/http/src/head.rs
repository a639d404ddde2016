//! What is read from a request's head before its body: its ids, single-valued headers, and a
//! declared length over the endpoint's limit.

use spin_sdk::http::Request;

use crate::problem::Problem;

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
