//! Release: puts reserved units on the spot market (the double sell).

use reservations_domain::capacity::CapacityAction;
use reservations_domain::values::instant;
use reservations_http::Incoming;
use reservations_http::input::not_null;
use reservations_http::input::{Json, Path, ReservationPath};
use reservations_http::operation::CapacityAsked;
use reservations_http::operation::asked;
use reservations_http::{Call, Operation, Problem, routes, serve};
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("release"; authenticated: release), incoming)
}

/// A release: `{ "unitIds": [...], "reason": "...", "until": "<RFC 3339>"? }`, the v1
/// contract's request body plus an optional end of the release.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReleaseBody {
    unit_ids: Vec<String>,
    #[serde(default, deserialize_with = "not_null")]
    reason: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    until: Option<String>,
}

/// `POST .../release`: puts reserved units on the spot market.
fn release(
    call: &Call<'_>,
    Path(path): Path<ReservationPath>,
    Json(body): Json<ReleaseBody>,
) -> Result<Operation, Problem> {
    let until = body
        .until
        .as_deref()
        .map(|text| instant("until", text))
        .transpose()?;
    Ok(Operation::ChangeCapacity(CapacityAsked {
        until,
        ..asked(
            call,
            CapacityAction::Release,
            path,
            body.unit_ids,
            body.reason,
        )?
    }))
}
