//! Release: puts reserved units on the spot market (the double sell).

use reservations_http::Incoming;
use reservations_http::capacity::release;
use reservations_http::{routes, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("release"; authenticated: release), incoming)
}
