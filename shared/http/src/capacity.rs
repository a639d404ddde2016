//! The one handler behind release, reclaim and dry run: three components, one code path,
//! so a dry run can never disagree with the reclaim it predicts.

use reservations_domain::capacity::CapacityAction;
use reservations_store::capacity::{CapacityRequest, Representation};
use serde::Deserialize;
use spin_sdk::http::Request;

use crate::problem::Problem;
use crate::render;
use crate::request::{Call, not_null};
use crate::response::Reply;

/// `{ "unitIds": [...], "reason": "..." }`, as the seed's request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CapacityBody {
    pub unit_ids: Vec<String>,
    #[serde(default, deserialize_with = "not_null")]
    pub reason: Option<String>,
}

/// The longest `reason` recorded.
pub const MAX_REASON_LEN: usize = 1024;

/// `POST .../release`: puts reserved units on the spot market.
pub fn release(call: &Call<'_>) -> Result<Reply, Problem> {
    change_capacity(call, CapacityAction::Release)
}

/// `POST .../reclaim`: takes released units back, terminating the spot VMs on them.
pub fn reclaim(call: &Call<'_>) -> Result<Reply, Problem> {
    change_capacity(call, CapacityAction::Reclaim)
}

/// `POST .../reclaim/dry-run`: what the reclaim would do, writing nothing.
pub fn reclaim_dry_run(call: &Call<'_>) -> Result<Reply, Problem> {
    change_capacity(call, CapacityAction::ReclaimDryRun)
}

fn change_capacity(call: &Call<'_>, action: CapacityAction) -> Result<Reply, Problem> {
    let node_id = call.path_id("nodeId", "reservation")?;
    let reservation_id = call.path_id("id", "reservation")?;
    let body: CapacityBody = call.json_body()?;
    check_reason(body.reason.as_deref())?;
    let representation = preferred_representation(call.request);
    let outcome = call.store.change_capacity(
        &call.context(),
        CapacityRequest {
            action,
            node_id,
            reservation_id,
            unit_ids: &body.unit_ids,
            reason: body.reason.as_deref(),
            representation,
        },
    )?;
    let mut reply = match action {
        CapacityAction::Release => Reply::ok(render::reservation_with(
            &outcome.reservation,
            call.now,
            representation,
        )),
        CapacityAction::Reclaim => Reply::ok(render::reclaim(&outcome, call.now)),
        CapacityAction::ReclaimDryRun => Reply::ok(render::reclaim_dry_run(&outcome, call.now)),
    };
    if representation == Representation::Minimal {
        reply
            .headers
            .push(("preference-applied", "return=minimal".to_owned()));
    }
    Ok(reply)
}

/// `Prefer: return=minimal` (RFC 7240) leaves the reservation's unit lists out of the
/// response, so a release or reclaim on a huge reservation costs only the units it names.
fn preferred_representation(request: &Request) -> Representation {
    let minimal = request
        .header("prefer")
        .and_then(|v| v.as_str())
        .is_some_and(|prefer| {
            prefer
                .split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("return=minimal"))
        });
    if minimal {
        Representation::Minimal
    } else {
        Representation::Full
    }
}

/// A free-text reason: bounded, and without control characters that would corrupt logs.
pub fn check_reason(reason: Option<&str>) -> Result<(), Problem> {
    match reason {
        Some(r) if r.chars().count() > MAX_REASON_LEN => Err(Problem::invalid(
            "reason",
            format!("reason may have at most {MAX_REASON_LEN} characters"),
        )),
        Some(r) if r.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => Err(
            Problem::invalid("reason", "reason may not contain control characters"),
        ),
        _ => Ok(()),
    }
}
