//! Reclaim dry run: exactly what a reclaim would do, writing nothing.

use reservations_domain::capacity::CapacityAction;
use reservations_http::Incoming;
use reservations_http::input::{Json, Path, ReservationPath};
use reservations_http::operation::{ReclaimBody, take_back};
use reservations_http::{Call, Operation, Problem, routes, serve};
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("dry-run"; authenticated: reclaim_dry_run), incoming)
}

/// `POST .../reclaim/dry-run`: what the reclaim would do, writing nothing.
fn reclaim_dry_run(
    call: &Call<'_>,
    Path(path): Path<ReservationPath>,
    Json(body): Json<ReclaimBody>,
) -> Result<Operation, Problem> {
    take_back(call, CapacityAction::ReclaimDryRun, path, body)
}
