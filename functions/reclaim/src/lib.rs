//! Reclaim: takes released units back, terminating the spot VMs on them.

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
        "/v1/nodes/:nodeId/reservations/:id/reclaim",
        |request, params| serve_capacity(request, params, CapacityAction::Reclaim),
    );
    dispatch(&router, request)
}
