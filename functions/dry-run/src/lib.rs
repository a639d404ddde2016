//! Reclaim dry run: exactly what a reclaim would do, writing nothing.

use reservations_http::Incoming;
use reservations_http::capacity::reclaim_dry_run;
use reservations_http::{routes, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("dry-run"; authenticated: reclaim_dry_run), incoming)
}
