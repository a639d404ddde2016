//! Release: puts reserved units on the spot market (the double sell).

use reservations_domain::capacity::CapacityAction;
use reservations_domain::values::{Reason, instant};
use reservations_http::Incoming;
use reservations_http::capacity::{asked, change};
use reservations_http::input::{Json, Path, ReservationPath};
use reservations_http::request::not_null;
use reservations_http::{Call, Problem, Reply, routes, serve};
use reservations_store::capacity::CapacityChange;
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
) -> Result<Reply, Problem> {
    let until = body
        .until
        .as_deref()
        .map(|text| instant("until", text))
        .transpose()?;
    let reason = Reason::optional(body.reason)?;
    change(
        call,
        CapacityChange {
            until,
            ..asked(
                call,
                CapacityAction::Release,
                &path,
                &body.unit_ids,
                &reason,
            )
        },
    )
}
