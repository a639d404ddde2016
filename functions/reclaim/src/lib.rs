//! Reclaim: takes released units back, terminating the spot VMs on them.

use reservations_http::ReadRequest;
use reservations_http::capacity::reclaim;
use reservations_http::{handlers, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(ReadRequest(request): ReadRequest) -> Response {
    serve("reclaim", handlers![Authenticated: reclaim], request)
}
