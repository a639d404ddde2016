//! Release, reclaim and dry run: one computation, three callers.
//!
//! - Release: `releasedUnitIds ∪= unitIds`. Only idle units (no running VM, or a spot VM) may
//!   go to the spot market, so a community or verified VM never sits on a released unit.
//! - Reclaim: `releasedUnitIds −= unitIds`, then every running VM on those units is terminated
//!   if it is spot and left running (skipped) if not.
//! - Dry run: exactly the reclaim's checks and computation; the caller writes nothing.
//!
//! The plan is the whole decision: besides what the answer reports, it lists what the write
//! changes (the units released or reclaimed, the VMs stopped now or given an earlier
//! deadline, with why) and who must be told, so the store writes it as it is.
//!
//! The functions see only the units a request names, so their cost is O(units in the
//! request), never O(size of the reservation or node).

use std::collections::{BTreeMap, BTreeSet};

use crate::audit::AffectedVm;
use crate::error::DomainError;
use crate::notice::{InterruptionReason, after, shorten, validate_until, vm_running_at};
use crate::reservation::{Status, Term, UnitIds};
use crate::vm::{RunningVm, TerminationReason, Tier};
use crate::{Timestamp, UnitId, VmId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapacityAction {
    Release,
    Reclaim,
    /// A reclaim that reports what it would do and changes nothing.
    ReclaimDryRun,
}

impl CapacityAction {
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

/// The reservation as a capacity request sees it: its status, its term and which of the
/// requested units belong to it.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityTarget {
    pub status: Status,
    pub term: Term,
    pub requested_units: BTreeSet<UnitId>,
}

/// What a release, reclaim or dry run does: what its answer reports, and everything its
/// write changes (a dry run writes nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityPlan {
    /// The action of the event the write appends.
    pub event_action: &'static str,
    /// Units put on the spot market (a release: every requested unit), until
    /// `released_until` or, when that is `None`, until they are reclaimed.
    pub released: Vec<UnitId>,
    pub released_until: Option<Timestamp>,
    /// Units taken back from the spot market (a reclaim: every requested unit).
    pub reclaimed: Vec<UnitId>,
    /// Spot VMs terminated (reclaim) or that would be (dry run), sorted.
    pub terminate: Vec<VmId>,
    /// Non-spot VMs left running, sorted.
    pub skip: Vec<VmId>,
    /// The spot VMs that keep running until a deadline instead of stopping now (a reclaim
    /// with notice, a release with `until`), each with its deadline after this plan: never
    /// later than the one it had.
    pub deadlines: BTreeMap<VmId, Timestamp>,
    /// The spot VMs that stop now, sorted.
    pub stopped: Vec<StoppedVm>,
    /// The spot VMs whose deadline moves earlier (a deadline no earlier than the one a VM
    /// has changes nothing), sorted.
    pub noticed: Vec<NoticedVm>,
    /// The VMs stopped or given a deadline, with their orgs and all their units: who must
    /// be told.
    pub affected: Vec<AffectedVm>,
}

impl CapacityPlan {
    /// Brings a reservation's units, each `(unit, released, releasedUntil)` as stored, to
    /// what the plan's write leaves: the released units released until `released_until`,
    /// the reclaimed ones not released.
    pub fn apply_to_units<'u>(
        &self,
        units: impl IntoIterator<Item = (&'u UnitId, &'u mut bool, &'u mut Option<Timestamp>)>,
    ) {
        let released: BTreeSet<&UnitId> = self.released.iter().collect();
        let reclaimed: BTreeSet<&UnitId> = self.reclaimed.iter().collect();
        for (unit, is_released, until) in units {
            if released.contains(unit) {
                (*is_released, *until) = (true, self.released_until);
            } else if reclaimed.contains(unit) {
                (*is_released, *until) = (false, None);
            }
        }
    }
}

/// A spot VM a reclaim stops now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedVm {
    pub vm_id: VmId,
    pub reason: TerminationReason,
}

/// A spot VM given an earlier deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticedVm {
    pub vm_id: VmId,
    pub terminates_at: Timestamp,
    pub reason: InterruptionReason,
    /// Its units the notice is about (the requested ones), in the VM's order.
    pub unit_ids: Vec<UnitId>,
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
        .filter(|unit| !target.requested_units.contains(*unit))
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

    match action {
        CapacityAction::Release => {
            let busy: Vec<&RunningVm> = vms_on_requested
                .clone()
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
                // The spot VMs already on the units stop when the release ends.
                for vm in vms_on_requested {
                    deadlines.insert(vm.id.clone(), shorten(vm.terminates_at, until));
                }
            }
            let changes = VmChanges::of(
                &running_vms,
                &requested,
                &[],
                &deadlines,
                InterruptionReason::ReleaseEnds,
            );
            Ok(CapacityPlan {
                event_action: "reservation.release",
                released: unit_ids.to_vec(),
                released_until: until,
                reclaimed: Vec::new(),
                terminate: Vec::new(),
                skip: Vec::new(),
                deadlines,
                stopped: changes.stopped,
                noticed: changes.noticed,
                affected: changes.affected,
            })
        }
        CapacityAction::Reclaim | CapacityAction::ReclaimDryRun => {
            let (spot, not_spot): (Vec<&RunningVm>, Vec<&RunningVm>) =
                vms_on_requested.partition(|vm| vm.tier == Tier::Spot);
            let sorted_ids = |vms: &[&RunningVm]| {
                vms.iter()
                    .map(|vm| vm.id.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            let deadlines: BTreeMap<VmId, Timestamp> = match notice_seconds {
                0 => BTreeMap::new(),
                seconds => {
                    let deadline = after(now, seconds);
                    spot.iter()
                        .map(|vm| (vm.id.clone(), shorten(vm.terminates_at, deadline)))
                        .collect()
                }
            };
            let terminate = sorted_ids(&spot);
            let changes = VmChanges::of(
                &running_vms,
                &requested,
                &terminate,
                &deadlines,
                InterruptionReason::Reclaimed,
            );
            Ok(CapacityPlan {
                event_action: "reservation.reclaim",
                released: Vec::new(),
                released_until: None,
                reclaimed: unit_ids.to_vec(),
                terminate,
                skip: sorted_ids(&not_spot),
                deadlines,
                stopped: changes.stopped,
                noticed: changes.noticed,
                affected: changes.affected,
            })
        }
    }
}

/// What a plan does to the running VMs on the requested units.
struct VmChanges {
    stopped: Vec<StoppedVm>,
    noticed: Vec<NoticedVm>,
    affected: Vec<AffectedVm>,
}

impl VmChanges {
    /// The VMs in `terminate` without a deadline stop now; those with one are noticed when
    /// it is earlier than the one they had (a deadline only moves earlier), for `reason`.
    fn of(
        running_vms: &[&RunningVm],
        requested: &BTreeSet<&UnitId>,
        terminate: &[VmId],
        deadlines: &BTreeMap<VmId, Timestamp>,
        reason: InterruptionReason,
    ) -> VmChanges {
        let mut changes = VmChanges {
            stopped: Vec::new(),
            noticed: Vec::new(),
            affected: Vec::new(),
        };
        let mut vms = running_vms.to_vec();
        vms.sort_by(|a, b| a.id.cmp(&b.id));
        vms.dedup_by(|a, b| a.id == b.id);
        for vm in vms {
            match deadlines.get(&vm.id) {
                Some(&deadline) => {
                    if vm.terminates_at.is_none_or(|had| had > deadline) {
                        changes.noticed.push(NoticedVm {
                            vm_id: vm.id.clone(),
                            terminates_at: deadline,
                            reason,
                            unit_ids: vm
                                .unit_ids
                                .iter()
                                .filter(|unit| requested.contains(unit))
                                .cloned()
                                .collect(),
                        });
                    }
                }
                None if terminate.contains(&vm.id) => changes.stopped.push(StoppedVm {
                    vm_id: vm.id.clone(),
                    reason: TerminationReason::Reclaimed,
                }),
                None => continue,
            }
            changes.affected.push(AffectedVm {
                vm_id: vm.id.clone(),
                org_id: vm.org_id.clone(),
                unit_ids: vm.unit_ids.clone(),
            });
        }
        changes
    }
}
