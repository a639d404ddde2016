//! Reclaim dry run: exactly what a reclaim would do, writing nothing.

use reservations_domain::capacity::CapacityAction;
use reservations_http::ReadRequest;
use reservations_http::capacity::serve_capacity;
use reservations_http::dispatch;
use spin_sdk::http::{Response, Router};
use spin_sdk::http_component;

#[http_component]
fn handle(ReadRequest(request): ReadRequest) -> Response {
    let mut router = Router::new();
    router.post(
        "/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run",
        |request, params| serve_capacity(request, params, CapacityAction::ReclaimDryRun),
    );
    dispatch(&router, request)
}
