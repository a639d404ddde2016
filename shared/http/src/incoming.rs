//! The request as a component receives it: its body read in full, or a 400 problem when the
//! body cannot be read (a malformed chunked encoding, a connection cut mid-body). That is
//! the client's fault; Spin SDK's own `Request` answers it with a plain-text 500.

use std::future::Future;
use std::pin::Pin;

use spin_sdk::http::conversions::TryFromIncomingRequest;
use spin_sdk::http::{IncomingRequest, IntoResponse, Request, Response};

use crate::call::problem_response;
use crate::problem::Problem;

/// A request with its whole body; the parameter of every component's handler.
pub struct ReadRequest(pub Request);

/// Why a request's body could not be read, and where the request was going.
pub struct UnreadableBody {
    path: String,
    request_id: Option<String>,
    reason: String,
}

impl TryFromIncomingRequest for ReadRequest {
    type Error = UnreadableBody;

    fn try_from_incoming_request<'a>(
        request: IncomingRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Self, Self::Error>> + Send + 'a>>
    where
        Self: Sized + 'a,
    {
        Box::pin(async move {
            let path = request.path_with_query().unwrap_or_default();
            let request_id = request
                .headers()
                .get("x-request-id")
                .into_iter()
                .next()
                .and_then(|value| String::from_utf8(value).ok());
            Request::try_from_incoming_request(request)
                .await
                .map(ReadRequest)
                .map_err(|e| UnreadableBody {
                    path,
                    request_id,
                    reason: e.to_string(),
                })
        })
    }
}

impl IntoResponse for UnreadableBody {
    fn into_response(self) -> Response {
        let path = self.path.split('?').next().unwrap_or_default().to_owned();
        let request_id = self
            .request_id
            .filter(|id| {
                !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
            })
            .unwrap_or_else(|| format!("req-{}", crate::auth::random_hex(12)));
        let problem = Problem::bad_request(
            "unreadable-body",
            format!("the request body could not be read: {}", self.reason),
        );
        problem_response(&problem, &request_id, &path)
    }
}
