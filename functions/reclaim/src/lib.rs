//! Reclaim: takes released units back, terminating the spot VMs on them.

use reservations_http::Incoming;
use reservations_http::capacity::reclaim;
use reservations_http::{routes, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("reclaim"; authenticated: reclaim), incoming)
}
