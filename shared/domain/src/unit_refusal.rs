//! Why one unit refused a placement: a module of its own, so that the refusals (`error`) can
//! carry it without depending on the placement rules.

use serde::Serialize;

use crate::{Timestamp, UnitId, VmId};

/// Why one unit refused a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalReason {
    UnknownUnit,
    UnitBusy,
    /// The unit's VM is under notice: busy until its `terminatesAt`.
    UnitUnderNotice,
    WithheldNeedsReview,
    ReleasedSpotOnly,
    ReservedForAudience,
    FutureReservationSpotOnly,
    /// Refused because of a reservation the caller is no party of.
    Unavailable,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::UnknownUnit => "unknown-unit",
            RefusalReason::UnitBusy => "unit-busy",
            RefusalReason::UnitUnderNotice => "unit-under-notice",
            RefusalReason::WithheldNeedsReview => "withheld-needs-review",
            RefusalReason::ReleasedSpotOnly => "released-spot-only",
            RefusalReason::ReservedForAudience => "reserved-for-audience",
            RefusalReason::FutureReservationSpotOnly => "future-reservation-spot-only",
            RefusalReason::Unavailable => "unavailable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitRefusal {
    pub unit_id: UnitId,
    pub reason: RefusalReason,
    /// `unit-under-notice`: the VM that holds the unit, and until when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<VmId>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_instant"
    )]
    pub terminates_at: Option<Timestamp>,
}

fn serialize_instant<S: serde::Serializer>(
    at: &Option<Timestamp>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => serializer.serialize_str(&crate::time::to_rfc3339(*at)),
        None => serializer.serialize_none(),
    }
}

impl UnitRefusal {
    pub fn new(unit_id: UnitId, reason: RefusalReason) -> UnitRefusal {
        UnitRefusal {
            unit_id,
            reason,
            vm_id: None,
            terminates_at: None,
        }
    }
}
