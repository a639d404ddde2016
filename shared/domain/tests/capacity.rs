//! Release, reclaim and dry run: the one planning function behind all three.

use std::collections::BTreeMap;

use reservations_domain::audit::AffectedVm;

use reservations_domain::capacity::{
    CapacityAction, CapacityPlan, CapacityRequest, CapacityTarget, StoppedVm, plan_capacity_change,
};
use reservations_domain::reservation::{MAX_UNITS_PER_REQUEST, Status, Term, UnitIds};
use reservations_domain::time::from_millis;
use reservations_domain::vm::{RunningVm, TerminationReason, Tier};
use reservations_domain::{DomainError, Refusal};

use CapacityAction::{Reclaim, ReclaimDryRun, Release};

const ACTIONS: [CapacityAction; 3] = [Release, Reclaim, ReclaimDryRun];

/// What the rules plan for `action` on `units`, without notice or end.
fn planned(
    action: CapacityAction,
    units: &[String],
    target: &CapacityTarget,
    vms: &[RunningVm],
) -> Result<CapacityPlan, DomainError> {
    let units = UnitIds::check("unitIds", units, MAX_UNITS_PER_REQUEST)?;
    let now = from_millis(1_000_000);
    plan_capacity_change(&CapacityRequest::new(action, units, now), target, vms)
}

/// A term that began long before the requests and has no end.
fn open_term() -> Term {
    Term {
        starts_at: from_millis(0),
        ends_at: None,
    }
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A reservation in `status` that has `units` among the requested ones.
fn target(status: Status, units: &[&str]) -> CapacityTarget {
    CapacityTarget {
        status,
        term: open_term(),
        requested_units: units.iter().map(|u| (*u).to_owned()).collect(),
    }
}

/// A release of `units` that touches no VM.
fn release_of(units: &[&str]) -> CapacityPlan {
    CapacityPlan {
        event_action: "reservation.release",
        released: ids(units),
        released_until: None,
        reclaimed: vec![],
        terminate: vec![],
        skip: vec![],
        deadlines: BTreeMap::new(),
        stopped: vec![],
        noticed: vec![],
        affected: vec![],
    }
}

/// A reclaim of `units` that touches no VM.
fn reclaim_of(units: &[&str]) -> CapacityPlan {
    CapacityPlan {
        event_action: "reservation.reclaim",
        released: vec![],
        reclaimed: ids(units),
        ..release_of(&[])
    }
}

/// The VMs a test's spot buyer runs belong to `org-<id>`.
fn vm(id: &str, tier: Tier, units: &[&str]) -> RunningVm {
    RunningVm {
        id: id.to_owned(),
        org_id: format!("org-{id}"),
        tier,
        unit_ids: ids(units),
        terminates_at: None,
    }
}

fn plan(
    action: CapacityAction,
    units: &[&str],
    target: &CapacityTarget,
    vms: &[RunningVm],
) -> Result<CapacityPlan, DomainError> {
    let result = planned(action, &ids(units), target, vms);
    if action == Reclaim {
        // Whatever a reclaim does, its dry run says it first.
        assert_eq!(
            planned(ReclaimDryRun, &ids(units), target, vms),
            result,
            "dry run disagrees with reclaim"
        );
    }
    result
}

// ---------------------------------------------------------------------------------------
// Validation, in order: list (invalid), strangers (invalid), status (conflict), idleness (conflict)
// ---------------------------------------------------------------------------------------

#[test]
fn the_unit_list_is_checked_first() {
    // Inactive and naming strangers too: the list error wins.
    let t = target(Status::Expired, &["u1"]);
    for action in ACTIONS {
        let err = plan(action, &[], &t, &[]).unwrap_err();
        assert!(
            matches!(
                err,
                DomainError::Invalid {
                    field: "unitIds",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.refusal(), Refusal::InvalidInput);

        let err = plan(action, &["u1", "zz", "u1", "zz"], &t, &[]).unwrap_err();
        assert_eq!(
            err,
            DomainError::DuplicateIds {
                field: "unitIds",
                ids: ids(&["u1", "zz"])
            }
        );
        assert_eq!(err.refusal(), Refusal::InvalidInput);

        let too_many: Vec<String> = (0..=MAX_UNITS_PER_REQUEST)
            .map(|i| format!("u{i}"))
            .collect();
        let err = planned(action, &too_many, &t, &[]).unwrap_err();
        assert!(
            matches!(
                err,
                DomainError::Invalid {
                    field: "unitIds",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn the_request_may_name_the_maximum() {
    let units: Vec<String> = (0..MAX_UNITS_PER_REQUEST)
        .map(|i| format!("u{i}"))
        .collect();
    let t = CapacityTarget {
        status: Status::Active,
        term: open_term(),
        requested_units: units.iter().cloned().collect(),
    };
    let released = planned(Release, &units, &t, &[]).unwrap();
    assert_eq!(released.released, units);
}

#[test]
fn strangers_come_second_and_are_named_in_request_order() {
    // Strangers on an expired reservation with a busy unit: invalid input, not a conflict.
    let t = target(Status::Expired, &["u1", "u2"]);
    let busy = [vm("vm-v", Tier::Verified, &["u1"])];
    for action in ACTIONS {
        let err = plan(action, &["x9", "u1", "x1", "u2"], &t, &busy).unwrap_err();
        assert_eq!(
            err,
            DomainError::NotInReservation {
                unit_ids: ids(&["x9", "x1"])
            }
        );
        assert_eq!(err.refusal(), Refusal::InvalidInput);
        assert_eq!(err.code(), "units-not-in-reservation");
    }
}

#[test]
fn only_an_active_reservation_is_acted_on() {
    let busy = [vm("vm-v", Tier::Verified, &["u1"])];
    for status in [
        Status::Pending,
        Status::Expired,
        Status::Cancelled,
        Status::NeedsReview,
    ] {
        let t = target(status, &["u1"]);
        for action in ACTIONS {
            // Even a release of a busy unit reports the status first.
            let err = plan(action, &["u1"], &t, &busy).unwrap_err();
            assert_eq!(err, DomainError::NotActive { status }, "{action:?}");
            assert_eq!(err.refusal(), Refusal::Conflict);
            assert_eq!(err.code(), "reservation-not-active");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Release
// ---------------------------------------------------------------------------------------

#[test]
fn release_puts_idle_units_on_the_market() {
    let t = target(Status::Active, &["u1", "u2", "u3"]);
    let got = plan(Release, &["u2", "u3", "u1"], &t, &[]).unwrap();
    assert_eq!(
        got,
        release_of(&["u2", "u3", "u1"]),
        "every requested unit is written released, in request order; u3 was released \
         already, which is not an error"
    );
}

#[test]
fn releasing_released_units_is_a_no_op() {
    let t = target(Status::Active, &["u1", "u2"]);
    let spot = [vm("vm-s", Tier::Spot, &["u1"])];
    assert_eq!(
        plan(Release, &["u1", "u2"], &t, &spot),
        Ok(release_of(&["u1", "u2"])),
        "a spot VM on a unit released with no end keeps running as it was"
    );
}

#[test]
fn release_allows_spot_vms_and_never_terminates() {
    let t = target(Status::Active, &["u1", "u2"]);
    let vms = [
        vm("vm-s", Tier::Spot, &["u1"]),
        vm("vm-elsewhere", Tier::Verified, &["u7"]),
    ];
    let got = plan(Release, &["u1", "u2"], &t, &vms).unwrap();
    assert_eq!(got, release_of(&["u1", "u2"]));
}

#[test]
fn release_refuses_units_running_community_or_verified_vms() {
    let t = target(Status::Active, &["u1", "u2", "u3", "u4"]);
    let vms = [
        vm("vm-z", Tier::Verified, &["u3", "u9"]),
        vm("vm-c", Tier::Community, &["u1"]),
        vm("vm-s", Tier::Spot, &["u2"]),
        vm("vm-unrequested", Tier::Verified, &["u4"]),
    ];
    let err = plan(Release, &["u3", "u2", "u1"], &t, &vms).unwrap_err();
    assert_eq!(
        err,
        DomainError::UnitsNotIdle {
            unit_ids: ids(&["u1", "u3"]),
            vm_ids: ids(&["vm-c", "vm-z"]),
        },
        "names the requested busy units and their VMs, sorted; u9 and u4 were not asked for"
    );
    assert_eq!(err.refusal(), Refusal::Conflict);
    assert_eq!(err.code(), "units-not-idle");
    // The same units reclaim fine: the check is release's only.
    assert!(plan(Reclaim, &["u3", "u2", "u1"], &t, &vms).is_ok());
}

// ---------------------------------------------------------------------------------------
// Reclaim and dry run
// ---------------------------------------------------------------------------------------

#[test]
fn reclaim_terminates_spot_and_skips_the_rest() {
    let t = target(Status::Active, &["u1", "u2", "u3", "u3b", "u4"]);
    let vms = [
        vm("vm-s2", Tier::Spot, &["u2"]),
        vm("vm-s1", Tier::Spot, &["u1"]),
        // An audience VM on a unit that was not released.
        vm("vm-v", Tier::Verified, &["u3"]),
        // A spot VM on a unit that was not released (placed while the term was pending).
        vm("vm-s3", Tier::Spot, &["u3b"]),
        vm("vm-c", Tier::Community, &["u9"]),
        // Released, but not asked for: untouched.
        vm("vm-s4", Tier::Spot, &["u4"]),
    ];
    let got = plan(Reclaim, &["u3", "u2", "u3b", "u1"], &t, &vms).unwrap();
    assert_eq!(
        got,
        CapacityPlan {
            terminate: ids(&["vm-s1", "vm-s2", "vm-s3"]),
            skip: ids(&["vm-v"]),
            stopped: ["vm-s1", "vm-s2", "vm-s3"]
                .map(|id| StoppedVm {
                    vm_id: id.to_owned(),
                    reason: TerminationReason::Reclaimed,
                })
                .to_vec(),
            affected: [("vm-s1", "u1"), ("vm-s2", "u2"), ("vm-s3", "u3b")]
                .map(|(id, unit)| AffectedVm {
                    vm_id: id.to_owned(),
                    org_id: format!("org-{id}"),
                    unit_ids: ids(&[unit]),
                })
                .to_vec(),
            ..reclaim_of(&["u3", "u2", "u3b", "u1"])
        }
    );
}

#[test]
fn reclaiming_units_that_are_not_released_is_not_an_error() {
    let t = target(Status::Active, &["u1", "u2"]);
    for action in [Reclaim, ReclaimDryRun] {
        assert_eq!(
            plan(action, &["u2", "u1"], &t, &[]),
            Ok(reclaim_of(&["u2", "u1"]))
        );
    }
}

#[test]
fn a_vm_on_several_requested_units_appears_once() {
    let t = target(Status::Active, &["u1", "u2", "u3"]);
    let vms = [
        vm("vm-s", Tier::Spot, &["u1", "u2", "u5"]),
        vm("vm-s", Tier::Spot, &["u1", "u2", "u5"]),
        vm("vm-v", Tier::Verified, &["u3", "u4"]),
    ];
    let got = plan(Reclaim, &["u1", "u2", "u3"], &t, &vms).unwrap();
    assert_eq!(got.terminate, ids(&["vm-s"]));
    assert_eq!(got.skip, ids(&["vm-v"]));
    assert_eq!(got.stopped.len(), 1, "{:?}", got.stopped);
    assert_eq!(got.affected.len(), 1, "{:?}", got.affected);
    assert_eq!(
        got.affected[0].unit_ids,
        ids(&["u1", "u2", "u5"]),
        "all of its units"
    );
}

#[test]
fn terminated_and_skipped_are_sorted() {
    let units: Vec<String> = (0..20).map(|i| format!("u{i:02}")).collect();
    let t = CapacityTarget {
        status: Status::Active,
        term: open_term(),
        requested_units: units.iter().cloned().collect(),
    };
    let vms: Vec<RunningVm> = (0..20)
        .rev()
        .map(|i| RunningVm {
            id: format!("vm-{}", (i * 7) % 20),
            org_id: "org-spot".to_owned(),
            tier: if i % 3 == 0 {
                Tier::Community
            } else {
                Tier::Spot
            },
            unit_ids: vec![format!("u{i:02}")],
            terminates_at: None,
        })
        .collect();
    let request: Vec<String> = units.iter().rev().cloned().collect();
    let got = planned(Reclaim, &request, &t, &vms).unwrap();
    let mut sorted = got.terminate.clone();
    sorted.sort();
    assert_eq!(got.terminate, sorted);
    let mut sorted = got.skip.clone();
    sorted.sort();
    assert_eq!(got.skip, sorted);
    assert_eq!(got.terminate.len() + got.skip.len(), 20);
    assert_eq!(got.reclaimed, request, "in request order");
    assert_eq!(planned(ReclaimDryRun, &request, &t, &vms), Ok(got));
}

#[test]
fn dry_run_equals_reclaim_on_every_outcome() {
    let active = target(Status::Active, &["u1", "u2"]);
    let pending = target(Status::Pending, &["u1"]);
    let vms = [
        vm("a", Tier::Spot, &["u1"]),
        vm("b", Tier::Verified, &["u2"]),
    ];
    let cases: [(&[&str], &CapacityTarget); 6] = [
        (&["u1", "u2"], &active),
        (&["u2"], &active),
        (&[], &active),
        (&["u1", "u1"], &active),
        (&["u3"], &active),
        (&["u1"], &pending),
    ];
    for (units, t) in cases {
        assert_eq!(
            planned(ReclaimDryRun, &ids(units), t, &vms),
            planned(Reclaim, &ids(units), t, &vms),
            "{units:?}"
        );
    }
}

#[test]
fn actions() {
    assert!(Release.writes());
    assert!(Reclaim.writes());
    assert!(!ReclaimDryRun.writes());
}

#[test]
fn refusals_have_the_kind_and_code_the_design_says() {
    use Refusal::{Conflict, Forbidden, Hidden, InvalidInput};
    #[rustfmt::skip]
    let rows: Vec<(DomainError, Refusal, &str)> = vec![
        (DomainError::NotFound { what: "reservation" },             Hidden,       "not-found"),
        (DomainError::Forbidden("no".into()),                        Forbidden,    "forbidden"),
        (DomainError::invalid("unitIds", "empty"),                   InvalidInput, "invalid-field"),
        (DomainError::DuplicateIds { field: "unitIds", ids: vec![] }, InvalidInput, "duplicate-ids"),
        (DomainError::NotInReservation { unit_ids: vec![] },         InvalidInput, "units-not-in-reservation"),
        (DomainError::UnknownUnits { unit_ids: vec![] },             InvalidInput, "unknown-units"),
        (DomainError::UnknownOrgs { org_ids: vec![] },               InvalidInput, "unknown-orgs"),
        (DomainError::NotActive { status: Status::Expired },         Conflict,     "reservation-not-active"),
        (DomainError::ReservationOverlap { unit_ids: vec![], reservation_ids: vec![] }, Conflict, "reservation-overlap"),
        (DomainError::UnitsNotIdle { unit_ids: vec![], vm_ids: vec![] }, Conflict, "units-not-idle"),
        (DomainError::UnitsInUse { unit_ids: vec![] },               Conflict,     "units-in-use"),
        (DomainError::PlacementRefused { refusals: vec![] },         Conflict,     "placement-refused"),
        (DomainError::VmAlreadyTerminated,                           Conflict,     "vm-terminated"),
    ];
    for (err, refusal, code) in rows {
        assert_eq!(err.refusal(), refusal, "{err:?}");
        assert_eq!(err.code(), code, "{err:?}");
    }
    assert_eq!(
        DomainError::NotActive {
            status: Status::NeedsReview
        }
        .to_string(),
        "the reservation is needs-review"
    );
}
