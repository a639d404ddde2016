//! Reclaim: takes released units back, terminating the spot VMs on them.

use reservations_domain::capacity::CapacityAction;
use reservations_http::Incoming;
use reservations_http::input::{Json, Path, ReservationPath};
use reservations_http::operation::{ReclaimBody, take_back};
use reservations_http::{Call, Operation, Problem, routes, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("reclaim"; authenticated: reclaim), incoming)
}

/// `POST .../reclaim`: takes released units back, terminating the spot VMs on them.
fn reclaim(
    call: &Call<'_>,
    Path(path): Path<ReservationPath>,
    Json(body): Json<ReclaimBody>,
) -> Result<Operation, Problem> {
    take_back(call, CapacityAction::Reclaim, path, body)
}
