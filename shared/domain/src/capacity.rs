//! Release, reclaim and dry run: one computation, three callers.
//!
//! - Release: `releasedUnitIds ∪= unitIds`. Only idle units (no running VM, or a spot VM) may
//!   go to the spot market, so a community or verified VM never sits on a released unit.
//! - Reclaim: `releasedUnitIds −= unitIds`, then every running VM on those units is terminated
//!   if it is spot and left running (skipped) if not.
//! - Dry run: exactly the reclaim's checks and computation; the caller writes nothing.
//!
//! The functions see only the units a request names, so their cost is O(units in the
//! request), never O(size of the reservation or node).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::DomainError;
use crate::notice::{after, shorten, validate_until, vm_running_at};
use crate::reservation::{Status, Term, UnitIds};
use crate::vm::{RunningVm, Tier};
use crate::{Timestamp, UnitId, VmId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapacityAction {
    Release,
    Reclaim,
    /// A reclaim that reports what it would do and changes nothing.
    ReclaimDryRun,
}

impl CapacityAction {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityAction::Release => "release",
            CapacityAction::Reclaim => "reclaim",
            CapacityAction::ReclaimDryRun => "reclaim-dry-run",
        }
    }

    /// Whether carrying out the plan writes anything.
    pub fn writes(self) -> bool {
        self != CapacityAction::ReclaimDryRun
    }
}

/// A release, reclaim or dry run as the rules see it: what is asked, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityRequest<'a> {
    pub action: CapacityAction,
    pub unit_ids: UnitIds<'a>,
    /// When it is asked: a VM whose deadline has passed by then has stopped.
    pub now: Timestamp,
    /// Reclaim and dry run: the seconds of notice the spot VMs get (0 stops them now).
    pub notice_seconds: i64,
    /// Release: when the units come back by themselves (`None`: when they are reclaimed).
    pub until: Option<Timestamp>,
}

impl<'a> CapacityRequest<'a> {
    /// `action` on `unit_ids` at `now`, without notice or end.
    pub fn new(action: CapacityAction, unit_ids: UnitIds<'a>, now: Timestamp) -> Self {
        CapacityRequest {
            action,
            unit_ids,
            now,
            notice_seconds: 0,
            until: None,
        }
    }
}

/// The reservation as a capacity request sees it: its status, its term and, for each
/// requested unit that belongs to it, whether that unit is on the spot market.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityTarget {
    pub status: Status,
    pub term: Term,
    pub requested_units: BTreeMap<UnitId, bool>,
}

/// What a release, reclaim or dry run does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityPlan {
    /// Units that go to the spot market now (release).
    pub newly_released: Vec<UnitId>,
    /// Units taken back from the spot market now (reclaim, dry run).
    pub newly_reclaimed: Vec<UnitId>,
    /// Spot VMs terminated (reclaim) or that would be (dry run), sorted.
    pub terminate: Vec<VmId>,
    /// Non-spot VMs left running, sorted.
    pub skip: Vec<VmId>,
    /// The spot VMs that keep running until a deadline instead of stopping now (a reclaim
    /// with notice, a release with `until`), each with its deadline after this plan: never
    /// later than the one it had.
    pub deadlines: BTreeMap<VmId, Timestamp>,
}

/// Checks a capacity request and computes what it does. Release, reclaim and dry run all
/// come through here, so a dry run cannot disagree with the reclaim it predicts.
///
/// Checks, in order (the unit list itself was checked into [`UnitIds`]): every unit part of
/// the reservation (invalid input listing the strangers), the reservation active
/// and inside its term (a conflict naming the status), and for a release, the units idle (a
/// conflict) and `until` later than now and inside the term (invalid input).
///
/// VMs whose deadline has passed at `now` have stopped and are not counted. A reclaim with
/// notice gives each spot VM a deadline instead of stopping it now (listing it in
/// `terminate` all the same); a release with `until` gives the spot VMs already on the units
/// that deadline. Deadlines only ever move earlier.
pub fn plan_capacity_change(
    request: &CapacityRequest<'_>,
    target: &CapacityTarget,
    running_vms: &[RunningVm],
) -> Result<CapacityPlan, DomainError> {
    let CapacityRequest {
        action,
        unit_ids,
        now,
        notice_seconds,
        until,
    } = *request;
    let running_vms: Vec<&RunningVm> = running_vms
        .iter()
        .filter(|vm| vm_running_at(vm.terminates_at, now))
        .collect();
    let unit_ids = unit_ids.as_slice();
    let strangers: Vec<UnitId> = unit_ids
        .iter()
        .filter(|unit| !target.requested_units.contains_key(*unit))
        .cloned()
        .collect();
    if !strangers.is_empty() {
        return Err(DomainError::NotInReservation {
            unit_ids: strangers,
        });
    }
    if target.status != Status::Active {
        return Err(DomainError::NotActive {
            status: target.status,
        });
    }
    let requested: BTreeSet<&UnitId> = unit_ids.iter().collect();
    let vms_on_requested = running_vms
        .iter()
        .copied()
        .filter(|vm| vm.unit_ids.iter().any(|u| requested.contains(u)));
    let is_released = |unit: &UnitId| target.requested_units.get(unit).copied() == Some(true);

    match action {
        CapacityAction::Release => {
            let busy: Vec<&RunningVm> = vms_on_requested
                .filter(|vm| vm.tier != Tier::Spot)
                .collect();
            if !busy.is_empty() {
                let unit_ids = busy
                    .iter()
                    .flat_map(|vm| vm.unit_ids.iter().filter(|u| requested.contains(u)))
                    .cloned()
                    .collect::<BTreeSet<_>>();
                let vm_ids = busy.iter().map(|vm| vm.id.clone()).collect::<BTreeSet<_>>();
                return Err(DomainError::UnitsNotIdle {
                    unit_ids: unit_ids.into_iter().collect(),
                    vm_ids: vm_ids.into_iter().collect(),
                });
            }
            let mut deadlines = BTreeMap::new();
            if let Some(until) = until {
                validate_until(until, &target.term, now)?;
                for vm in running_vms.iter().filter(|vm| {
                    vm.tier == Tier::Spot && vm.unit_ids.iter().any(|u| requested.contains(u))
                }) {
                    deadlines.insert(vm.id.clone(), shorten(vm.terminates_at, until));
                }
            }
            Ok(CapacityPlan {
                newly_released: unit_ids
                    .iter()
                    .filter(|u| !is_released(u))
                    .cloned()
                    .collect(),
                deadlines,
                ..CapacityPlan::default()
            })
        }
        CapacityAction::Reclaim | CapacityAction::ReclaimDryRun => {
            let (spot, not_spot): (Vec<&RunningVm>, Vec<&RunningVm>) =
                vms_on_requested.partition(|vm| vm.tier == Tier::Spot);
            let sorted_ids = |vms: Vec<&RunningVm>| {
                vms.into_iter()
                    .map(|vm| vm.id.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            let deadlines = match notice_seconds {
                0 => BTreeMap::new(),
                seconds => {
                    let deadline = after(now, seconds);
                    spot.iter()
                        .map(|vm| (vm.id.clone(), shorten(vm.terminates_at, deadline)))
                        .collect()
                }
            };
            Ok(CapacityPlan {
                newly_released: Vec::new(),
                newly_reclaimed: unit_ids
                    .iter()
                    .filter(|u| is_released(u))
                    .cloned()
                    .collect(),
                terminate: sorted_ids(spot),
                skip: sorted_ids(not_spot),
                deadlines,
            })
        }
    }
}
