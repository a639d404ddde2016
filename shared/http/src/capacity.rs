//! What the release, reclaim and dry-run components share: the reclaim's body (the dry
//! run's too) and the operation the three ask for, [`Operation::ChangeCapacity`], which the
//! store plans by one code path, so a dry run can never disagree with the reclaim it predicts.

use reservations_domain::capacity::CapacityAction;
use reservations_domain::values::Reason;
use reservations_store::capacity::Representation;
use serde::Deserialize;
use spin_sdk::http::Request;

use crate::input::ReservationPath;
use crate::operation::{CapacityAsked, Operation};
use crate::problem::Problem;
use crate::request::{Call, not_null};

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
    path: ReservationPath,
    body: ReclaimBody,
) -> Result<Operation, Problem> {
    Ok(Operation::ChangeCapacity(CapacityAsked {
        notice_seconds: body.notice_seconds,
        ..asked(call, action, path, body.unit_ids, body.reason)?
    }))
}

/// A capacity request without notice or end: `action` on units of the reservation, why, and
/// how much of the reservation to answer with.
pub fn asked(
    call: &Call<'_>,
    action: CapacityAction,
    at: ReservationPath,
    unit_ids: Vec<String>,
    reason: Option<String>,
) -> Result<CapacityAsked, Problem> {
    Ok(CapacityAsked {
        action,
        at,
        unit_ids,
        reason: Reason::optional(reason)?,
        representation: preferred_representation(call.request),
        notice_seconds: None,
        until: None,
    })
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
