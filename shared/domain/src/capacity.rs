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
use crate::notice::{Notice, after, shorten, validate_until, vm_running_at};
use crate::reservation::{MAX_UNITS_PER_REQUEST, Status, Term, validate_unit_list};
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

/// The reservation as a capacity request sees it: its status and, for each requested unit
/// that belongs to it, whether that unit is on the spot market.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityTarget {
    pub status: Status,
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
/// Checks, in order: the unit list (non-empty, bounded, no repeats: invalid input), every
/// unit part of the reservation (invalid input listing the strangers), the reservation active
/// and inside its term (a conflict naming the status), and for a release, the units idle (a
/// conflict).
pub fn plan_capacity_change(
    action: CapacityAction,
    unit_ids: &[UnitId],
    target: &CapacityTarget,
    running_vms: &[RunningVm],
) -> Result<CapacityPlan, DomainError> {
    plan_capacity_change_with(
        action,
        unit_ids,
        target,
        running_vms,
        &Notice::default(),
        None,
    )
}

/// [`plan_capacity_change`] with notices and deadlines: VMs whose deadline
/// has passed at `notice.now` have stopped and are not counted; a reclaim with
/// `notice_seconds` gives each spot VM a deadline instead of stopping it now (listing it in
/// `terminate` all the same); a release with `until` (checked against `term`) gives the spot
/// VMs already on the units that deadline. Deadlines only ever move earlier. With the
/// default [`Notice`] this is exactly an immediate reclaim's computation.
pub fn plan_capacity_change_with(
    action: CapacityAction,
    unit_ids: &[UnitId],
    target: &CapacityTarget,
    running_vms: &[RunningVm],
    notice: &Notice,
    term: Option<&Term>,
) -> Result<CapacityPlan, DomainError> {
    let still_running: Vec<RunningVm>;
    let running_vms = match notice.now {
        Some(now) => {
            still_running = running_vms
                .iter()
                .filter(|vm| vm_running_at(notice.deadlines.get(&vm.id).copied(), now))
                .cloned()
                .collect();
            &still_running[..]
        }
        None => running_vms,
    };
    validate_unit_list("unitIds", unit_ids, MAX_UNITS_PER_REQUEST)?;
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
            if let Some(until) = notice.until {
                let now = notice.now.unwrap_or(until);
                let term = term.copied().unwrap_or(Term {
                    starts_at: now,
                    ends_at: None,
                });
                validate_until(until, &term, now)?;
                for vm in running_vms.iter().filter(|vm| {
                    vm.tier == Tier::Spot && vm.unit_ids.iter().any(|u| requested.contains(u))
                }) {
                    deadlines.insert(
                        vm.id.clone(),
                        shorten(notice.deadlines.get(&vm.id).copied(), until),
                    );
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
            let deadlines = match (notice.now, notice.notice_seconds) {
                (Some(now), seconds) if seconds > 0 => {
                    let deadline = after(now, seconds);
                    spot.iter()
                        .map(|vm| {
                            let existing = notice.deadlines.get(&vm.id).copied();
                            (vm.id.clone(), shorten(existing, deadline))
                        })
                        .collect()
                }
                _ => BTreeMap::new(),
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
