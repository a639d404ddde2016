//! Properties of notices and deadlines over random histories: releases with and
//! without `until`, reclaims with and without `noticeSeconds`, placements, owners stopping
//! their VMs, and the clock moving on — all through the domain's own functions, the way the
//! store calls them. After every step, and at every instant the clock reaches:
//!
//! - the dry run predicts the reclaim exactly (the same plan, deadlines included);
//! - no unit runs two VMs at once, counting VMs inside their notice period;
//! - no non-spot VM sits on a unit that is released at that instant;
//! - a VM's `terminatesAt` never moves later, and a VM never runs past it.
//!
//! Every branch the histories are meant to exercise is counted, and the test fails when one
//! got too few cases.

mod property_seed;

use property_seed::property_seed;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

use reservations_domain::DomainError;
use reservations_domain::Timestamp;
use reservations_domain::capacity::{
    CapacityAction, CapacityPlan, CapacityRequest, CapacityTarget, plan_capacity_change,
};
use reservations_domain::notice::{after, released_at, vm_running_at};
use reservations_domain::placement::{UnitClaim, UnitFacts, VmNotice, placement_refusals_with};
use reservations_domain::reservation::{MAX_UNITS_PER_REQUEST, Status, Term, UnitIds};
use reservations_domain::time::from_millis;
use reservations_domain::vm::{RunningVm, Tier};

const UNITS: [&str; 4] = ["u0", "u1", "u2", "u3"];
const AUDIENCE: &str = "aud";
const BUYER: &str = "buyer";
/// The reservation's term ends this many seconds after the start of every history.
const TERM_SECONDS: i64 = 20_000;

#[derive(Debug, Clone)]
struct Vm {
    id: String,
    tier: Tier,
    units: Vec<String>,
    /// Stopped (by its owner or an immediate reclaim).
    stopped: bool,
    deadline: Option<Timestamp>,
}

#[derive(Debug, Clone)]
struct World {
    now: Timestamp,
    term: Term,
    /// Released units and the end of their release.
    released: BTreeMap<String, Option<Timestamp>>,
    vms: Vec<Vm>,
}

#[derive(Debug, Clone)]
enum Op {
    Release(Vec<String>, Option<i64>),
    Reclaim(Vec<String>, i64),
    Place(bool, Tier, Vec<String>),
    Stop(usize),
    Advance(i64),
}

impl World {
    fn new() -> World {
        let start = from_millis(1_700_000_000_000);
        World {
            now: start,
            term: Term {
                starts_at: from_millis(1_600_000_000_000),
                ends_at: Some(after(start, TERM_SECONDS)),
            },
            released: BTreeMap::new(),
            vms: Vec::new(),
        }
    }

    fn running_at(&self, vm: &Vm, now: Timestamp) -> bool {
        !vm.stopped && vm_running_at(vm.deadline, now)
    }

    fn is_released(&self, unit: &str, now: Timestamp) -> bool {
        self.released
            .get(unit)
            .is_some_and(|until| released_at(true, *until, now))
    }

    fn status(&self) -> Status {
        if self.term.contains(self.now) {
            Status::Active
        } else {
            Status::Expired
        }
    }

    /// What the store hands the planner: the rows still marked running (an ended VM's row
    /// stays running until a write touches it) with their deadlines.
    fn running_rows(&self) -> Vec<RunningVm> {
        self.vms
            .iter()
            .filter(|vm| !vm.stopped)
            .map(|vm| RunningVm {
                id: vm.id.clone(),
                org_id: format!("org-of-{}", vm.id),
                tier: vm.tier,
                unit_ids: vm.units.clone(),
                terminates_at: vm.deadline,
            })
            .collect()
    }

    /// What the rules plan for `action` on `units` at the world's now, with `notice_seconds`
    /// and `until`.
    fn plan(
        &self,
        action: CapacityAction,
        units: &[String],
        notice_seconds: i64,
        until: Option<Timestamp>,
    ) -> Result<CapacityPlan, DomainError> {
        let asked = CapacityRequest {
            notice_seconds,
            until,
            ..CapacityRequest::new(
                action,
                UnitIds::check("unitIds", units, MAX_UNITS_PER_REQUEST)?,
                self.now,
            )
        };
        plan_capacity_change(&asked, &self.target(units), &self.running_rows())
    }

    fn target(&self, units: &[String]) -> CapacityTarget {
        CapacityTarget {
            status: self.status(),
            term: self.term,
            requested_units: units.iter().cloned().collect(),
        }
    }

    fn facts(&self, unit: &str) -> (UnitFacts, BTreeMap<String, VmNotice>) {
        let mut notices = BTreeMap::new();
        let running = self
            .vms
            .iter()
            .find(|vm| self.running_at(vm, self.now) && vm.units.iter().any(|u| u == unit));
        if let Some(vm) = running
            && let Some(deadline) = vm.deadline
        {
            notices.insert(
                vm.id.clone(),
                VmNotice {
                    terminates_at: deadline,
                    reservation_id: "r1".into(),
                },
            );
        }
        let facts = UnitFacts {
            unit_id: unit.to_owned(),
            on_node: true,
            running_vm: running.map(|vm| vm.id.clone()),
            claims: vec![UnitClaim {
                reservation_id: "r1".into(),
                status: self.status(),
                released: self.is_released(unit, self.now),
                allowed_org_ids: vec![AUDIENCE.into()],
                party_org_ids: vec![AUDIENCE.into()],
            }],
        };
        (facts, notices)
    }

    /// Applies one operation; returns the branch it took.
    fn step(&mut self, op: &Op) -> Result<&'static str, TestCaseError> {
        match op {
            Op::Advance(seconds) => {
                self.now = after(self.now, *seconds);
                Ok("advance")
            }
            Op::Stop(i) => {
                let len = self.vms.len();
                if len == 0 {
                    return Ok("stop-nothing");
                }
                let now = self.now;
                let running = self.running_at(&self.vms[i % len], now);
                let vm = &mut self.vms[i % len];
                if running {
                    vm.stopped = true;
                    return Ok(if vm.deadline.is_some() {
                        "stop-under-notice"
                    } else {
                        "stop"
                    });
                }
                Ok("stop-ended")
            }
            Op::Place(audience, tier, units) => {
                let org = if *audience { AUDIENCE } else { BUYER };
                let mut refused = false;
                let mut deadline = None;
                for unit in units {
                    let (facts, notices) = self.facts(unit);
                    refused |= !placement_refusals_with(org, *tier, &[facts], &notices).is_empty();
                    if self.is_released(unit, self.now) && *tier == Tier::Spot {
                        let until = self.released[unit];
                        deadline = match (deadline, until) {
                            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
                            (a, b) => a.or(b),
                        };
                    }
                }
                if refused {
                    return Ok("place-refused");
                }
                self.vms.push(Vm {
                    id: format!("vm{:02}", self.vms.len()),
                    tier: *tier,
                    units: units.clone(),
                    stopped: false,
                    deadline,
                });
                Ok(if deadline.is_some() {
                    "place-with-deadline"
                } else {
                    "place"
                })
            }
            Op::Release(units, until) => {
                let until = until.map(|s| after(self.now, s));
                let plan = self.plan(CapacityAction::Release, units, 0, until);
                let Ok(plan) = plan else {
                    return Ok("release-refused");
                };
                prop_assert_eq!(&plan.released, units);
                for unit in &plan.released {
                    self.released.insert(unit.clone(), plan.released_until);
                }
                self.apply_notices(&plan)?;
                Ok(if plan.deadlines.is_empty() {
                    "release"
                } else {
                    "release-with-deadlines"
                })
            }
            Op::Reclaim(units, seconds) => {
                let plan = |action| self.plan(action, units, *seconds, None);
                let dry = plan(CapacityAction::ReclaimDryRun);
                let real = plan(CapacityAction::Reclaim);
                prop_assert_eq!(&dry, &real, "the dry run disagrees with the reclaim");
                let Ok(plan) = real else {
                    return Ok("reclaim-refused");
                };
                for vm in &plan.terminate {
                    let model = self.vms.iter().find(|v| &v.id == vm).expect("a model VM");
                    prop_assert!(self.running_at(model, self.now), "{} is not running", vm);
                    prop_assert_eq!(model.tier, Tier::Spot);
                }
                prop_assert_eq!(&plan.reclaimed, units);
                for unit in &plan.reclaimed {
                    self.released.remove(unit);
                }
                if plan.deadlines.is_empty() {
                    let stopped: Vec<&String> = plan.stopped.iter().map(|vm| &vm.vm_id).collect();
                    prop_assert_eq!(stopped, plan.terminate.iter().collect::<Vec<_>>());
                    for vm in &mut self.vms {
                        if plan.stopped.iter().any(|stopped| stopped.vm_id == vm.id) {
                            vm.stopped = true;
                        }
                    }
                    Ok("reclaim-now")
                } else {
                    prop_assert_eq!(
                        plan.deadlines.keys().cloned().collect::<BTreeSet<_>>(),
                        plan.terminate.iter().cloned().collect::<BTreeSet<_>>()
                    );
                    for deadline in plan.deadlines.values() {
                        prop_assert!(*deadline <= after(self.now, *seconds));
                        prop_assert!(*deadline > self.now);
                    }
                    prop_assert!(plan.stopped.is_empty());
                    self.apply_notices(&plan)?;
                    Ok("reclaim-with-notice")
                }
            }
        }
    }

    /// Writes the plan's notices as they are: each one earlier than the deadline its VM
    /// had; after them, every VM has the deadline the plan reports for it.
    fn apply_notices(&mut self, plan: &CapacityPlan) -> Result<(), TestCaseError> {
        for notice in &plan.noticed {
            let vm = self
                .vms
                .iter_mut()
                .find(|vm| vm.id == notice.vm_id)
                .expect("a model VM");
            if let Some(old) = vm.deadline {
                prop_assert!(
                    notice.terminates_at < old,
                    "{}'s deadline kept or moved later",
                    vm.id
                );
            }
            vm.deadline = Some(notice.terminates_at);
        }
        for (id, deadline) in &plan.deadlines {
            let vm = self.vms.iter().find(|vm| &vm.id == id).expect("a model VM");
            prop_assert_eq!(vm.deadline, Some(*deadline), "{}'s reported deadline", id);
        }
        Ok(())
    }

    fn check_invariants(&self, now: Timestamp) -> Result<(), TestCaseError> {
        let mut occupied = BTreeSet::new();
        for vm in self.vms.iter().filter(|vm| self.running_at(vm, now)) {
            if let Some(deadline) = vm.deadline {
                prop_assert!(now < deadline, "{} runs past its deadline", vm.id);
            }
            for unit in &vm.units {
                prop_assert!(occupied.insert(unit.clone()), "two VMs on {} at once", unit);
                if vm.tier != Tier::Spot {
                    prop_assert!(
                        !self.is_released(unit, now),
                        "{} VM {} on released unit {}",
                        vm.tier.as_str(),
                        vm.id,
                        unit
                    );
                }
            }
        }
        Ok(())
    }
}

fn units() -> impl Strategy<Value = Vec<String>> {
    proptest::sample::subsequence(UNITS.to_vec(), 1..=3)
        .prop_map(|units| units.into_iter().map(str::to_owned).collect())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (units(), proptest::option::of(prop_oneof![1i64..600, Just(TERM_SECONDS)]))
            .prop_map(|(u, until)| Op::Release(u, until)),
        3 => (units(), prop_oneof![Just(0i64), 1i64..900, Just(3600)])
            .prop_map(|(u, s)| Op::Reclaim(u, s)),
        4 => (any::<bool>(), prop_oneof![3 => Just(Tier::Spot), 1 => Just(Tier::Community), 1 => Just(Tier::Verified)], units())
            .prop_map(|(a, t, u)| Op::Place(a, t, u)),
        1 => (0usize..16).prop_map(Op::Stop),
        3 => prop_oneof![Just(0i64), 1i64..300, 300i64..1200].prop_map(Op::Advance),
    ]
}

#[test]
fn notices_and_deadlines_keep_the_invariants_through_any_history() {
    let counts: RefCell<BTreeMap<&'static str, usize>> = RefCell::default();
    let mut runner = TestRunner::new(Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(property_seed()),
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..40), |ops| {
            let mut world = World::new();
            for op in &ops {
                let branch = world.step(op)?;
                *counts.borrow_mut().entry(branch).or_default() += 1;
                world.check_invariants(world.now)?;
                // Every instant up to the next step sees the same rules: look at the
                // deadlines themselves and the millisecond before each.
                let deadlines: Vec<Timestamp> =
                    world.vms.iter().filter_map(|vm| vm.deadline).collect();
                for deadline in deadlines {
                    for at in [deadline - chrono::TimeDelta::milliseconds(1), deadline] {
                        if at >= world.now {
                            world.check_invariants(at)?;
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    let counts = counts.into_inner();
    for branch in [
        "advance",
        "place",
        "place-with-deadline",
        "place-refused",
        "release",
        "release-with-deadlines",
        "reclaim-now",
        "reclaim-with-notice",
        "stop",
        "stop-under-notice",
    ] {
        let got = counts.get(branch).copied().unwrap_or_default();
        assert!(
            got >= 20,
            "branch {branch} got only {got} cases: {counts:?}"
        );
    }
}
