//! What the release, reclaim and dry-run components share: the request as the store takes
//! it, the reclaim's body (the dry run's too), and the answer. The three handlers, in their
//! components, come through [`change`] to the store's one code path, so a dry run can never
//! disagree with the reclaim it predicts.

use reservations_domain::capacity::CapacityAction;
use reservations_domain::values::Reason;
use reservations_store::capacity::{CapacityChange, CapacityOutcome, Representation};
use serde::Deserialize;
use spin_sdk::http::Request;

use crate::input::ReservationPath;
use crate::problem::Problem;
use crate::render;
use crate::request::{Call, not_null};
use crate::response::Reply;

/// A reclaim or its dry run: the v1 contract's request body plus an optional notice for the spot
/// VMs, `noticeSeconds` (0–3600; absent or 0 stops them now, as the v1 contract says).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReclaimBody {
    pub unit_ids: Vec<String>,
    #[serde(default, deserialize_with = "not_null")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    pub notice_seconds: Option<i64>,
}

/// A reclaim or its dry run (`action`) of `body` on the reservation at `path`.
pub fn take_back(
    call: &Call<'_>,
    action: CapacityAction,
    path: &ReservationPath,
    body: ReclaimBody,
) -> Result<Reply, Problem> {
    let reason = Reason::optional(body.reason)?;
    change(
        call,
        CapacityChange {
            notice_seconds: body.notice_seconds,
            ..asked(call, action, path, &body.unit_ids, &reason)
        },
    )
}

/// A capacity request without notice or end: `action` on units of the reservation, why, and
/// how much of the reservation to answer with.
pub fn asked<'a>(
    call: &Call<'_>,
    action: CapacityAction,
    path: &'a ReservationPath,
    unit_ids: &'a [String],
    reason: &'a Option<Reason>,
) -> CapacityChange<'a> {
    CapacityChange {
        action,
        node_id: &path.node_id,
        reservation_id: &path.id,
        unit_ids,
        reason: reason.as_ref().map(Reason::as_str),
        representation: preferred_representation(call.request),
        notice_seconds: None,
        until: None,
    }
}

/// Carries `request` out (or, for a dry run, plans it) and answers with what it did.
pub fn change(call: &Call<'_>, request: CapacityChange<'_>) -> Result<Reply, Problem> {
    let answer = |outcome: &CapacityOutcome| {
        let mut reply = match request.action {
            CapacityAction::Release => Reply::ok(render::release(outcome, call.now)),
            CapacityAction::Reclaim => Reply::ok(render::reclaim(outcome, call.now)),
            CapacityAction::ReclaimDryRun => Reply::ok(render::reclaim_dry_run(outcome, call.now)),
        };
        if request.representation == Representation::Minimal {
            reply
                .headers
                .push(("preference-applied", "return=minimal".to_owned()));
        }
        reply
    };
    call.answered(answer, |ctx| call.store.change_capacity(ctx, request))
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
