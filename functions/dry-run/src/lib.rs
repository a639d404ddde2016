//! Reclaim dry run: exactly what a reclaim would do, writing nothing.

use reservations_http::ReadRequest;
use reservations_http::capacity::reclaim_dry_run;
use reservations_http::{handlers, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(ReadRequest(request): ReadRequest) -> Response {
    serve(
        "dry-run",
        handlers![Authenticated: reclaim_dry_run],
        request,
    )
}
