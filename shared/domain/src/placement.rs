//! Placement: who may put a VM on a unit.
//!
//! - A unit runs at most one VM at a time.
//! - Released unit: anyone, tier=spot only.
//! - Reserved, not released, reservation active: only the audience.
//! - Unit of a `needs-review` reservation: nobody.
//! - Unit with a pending (future) reservation: spot only, so it can be reclaimed when the
//!   term starts.
//! - Otherwise: anyone, any tier.
//!
//! A refusal never describes a reservation the caller may not see: to an org that is not a
//! party of the reservation behind it (owner, managing org, audience), a refusal caused by
//! that reservation is only "not available to you".

use std::collections::BTreeMap;

pub use crate::unit_refusal::{RefusalReason, UnitRefusal};

use crate::status::Status;
use crate::vm::Tier;
use crate::{OrgId, ReservationId, Timestamp, UnitId, VmId};

/// A running VM's notice, as placement sees it: until when it holds its units, and the
/// reservation that took them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmNotice {
    pub terminates_at: Timestamp,
    pub reservation_id: ReservationId,
}

/// A (non-cancelled) reservation that covers a unit, seen from that unit.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitClaim {
    pub reservation_id: ReservationId,
    pub status: Status,
    pub released: bool,
    pub allowed_org_ids: Vec<OrgId>,
    /// Everyone who may see the reservation: the node's owner, managing orgs and audience.
    pub party_org_ids: Vec<OrgId>,
}

/// Everything placement needs to know about one requested unit.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitFacts {
    pub unit_id: UnitId,
    pub on_node: bool,
    pub running_vm: Option<VmId>,
    pub claims: Vec<UnitClaim>,
}

/// Whether `org` may place a VM of `tier` on this unit; `None` means yes.
pub fn refusal_for_unit(org: &str, tier: Tier, unit: &UnitFacts) -> Option<RefusalReason> {
    refusal_for_unit_with(org, tier, unit, &BTreeMap::new())
}

/// [`refusal_for_unit`] knowing which running VMs are under notice: a unit whose VM is under
/// notice is busy until the deadline, and says so (`unit-under-notice`) to the parties of
/// the reservation that gave the notice; anyone else learns only that it is unavailable.
/// `units` must list only VMs still running (a VM whose deadline passed is gone).
pub fn refusal_for_unit_with(
    org: &str,
    tier: Tier,
    unit: &UnitFacts,
    notices: &BTreeMap<VmId, VmNotice>,
) -> Option<RefusalReason> {
    if let Some(notice) = unit.running_vm.as_ref().and_then(|vm| notices.get(vm)) {
        // Once that reservation is cancelled nobody is its party any more: the notice runs
        // on, and says nothing of the VM to anyone.
        let party = unit
            .claims
            .iter()
            .find(|c| c.reservation_id == notice.reservation_id)
            .is_some_and(|c| c.party_org_ids.iter().any(|o| o == org));
        return Some(if party {
            RefusalReason::UnitUnderNotice
        } else {
            RefusalReason::Unavailable
        });
    }
    let (reason, claim) = refusal_and_cause(org, tier, unit)?;
    match claim {
        Some(claim) if !claim.party_org_ids.iter().any(|o| o == org) => {
            Some(RefusalReason::Unavailable)
        }
        _ => Some(reason),
    }
}

/// The rule that refuses, and the reservation behind it (if a reservation is the cause).
fn refusal_and_cause<'a>(
    org: &str,
    tier: Tier,
    unit: &'a UnitFacts,
) -> Option<(RefusalReason, Option<&'a UnitClaim>)> {
    if !unit.on_node {
        return Some((RefusalReason::UnknownUnit, None));
    }
    if unit.running_vm.is_some() {
        return Some((RefusalReason::UnitBusy, None));
    }
    let claim_with = |status: Status| unit.claims.iter().find(|c| c.status == status);
    if let Some(withheld) = claim_with(Status::NeedsReview) {
        return Some((RefusalReason::WithheldNeedsReview, Some(withheld)));
    }
    if let Some(active) = claim_with(Status::Active) {
        if active.released {
            // The spot market is public: anyone may learn that a released unit sells spot only.
            return (tier != Tier::Spot).then_some((RefusalReason::ReleasedSpotOnly, None));
        }
        let in_audience = active.allowed_org_ids.iter().any(|o| o == org);
        return (!in_audience).then_some((RefusalReason::ReservedForAudience, Some(active)));
    }
    if let Some(pending) = claim_with(Status::Pending)
        && tier != Tier::Spot
    {
        return Some((RefusalReason::FutureReservationSpotOnly, Some(pending)));
    }
    None
}

/// Every refused unit of a placement request, in request order; empty means the VM may be placed.
pub fn placement_refusals(org: &str, tier: Tier, units: &[UnitFacts]) -> Vec<UnitRefusal> {
    placement_refusals_with(org, tier, units, &BTreeMap::new())
}

/// [`placement_refusals`] knowing which running VMs are under notice: a refusal for a unit
/// under notice names the VM and its deadline.
pub fn placement_refusals_with(
    org: &str,
    tier: Tier,
    units: &[UnitFacts],
    notices: &BTreeMap<VmId, VmNotice>,
) -> Vec<UnitRefusal> {
    units
        .iter()
        .filter_map(|unit| {
            let reason = refusal_for_unit_with(org, tier, unit, notices)?;
            let mut refusal = UnitRefusal::new(unit.unit_id.clone(), reason);
            if reason == RefusalReason::UnitUnderNotice {
                let vm = unit.running_vm.clone();
                refusal.terminates_at = vm
                    .as_ref()
                    .and_then(|v| notices.get(v))
                    .map(|n| n.terminates_at);
                refusal.vm_id = vm;
            }
            Some(refusal)
        })
        .collect()
}
