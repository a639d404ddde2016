//! Release: puts reserved units on the spot market (the double sell).

use reservations_http::ReadRequest;
use reservations_http::capacity::release;
use reservations_http::{handlers, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(ReadRequest(request): ReadRequest) -> Response {
    serve("release", handlers![Authenticated: release], request)
}
