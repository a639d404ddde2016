//! Properties of release, reclaim, dry run and placement over random worlds.
//!
//! A world is one reservation on a node: its units `u0..`, the released subset, a few node
//! units outside it (`x0..`), and running VMs — at most one per unit, some spanning the
//! reservation and units outside it, never a community or verified VM on a released unit.
//! Requests name a random subset of the reservation's units, in random order, sometimes with
//! a stranger or a repeat thrown in. Placement is also checked unit by unit against facts with
//! several claims (an active and pending reservations, needs-review ones, expired and
//! cancelled ones, on a unit that may have left the node).
//!
//! No property passes by returning early: the properties about a successful plan draw only
//! requests the rules accept and assert that they are accepted, and every property counts
//! the branches its cases took and fails when a branch got too few of them.

mod property_seed;

use property_seed::property_seed;
use std::collections::{BTreeMap, BTreeSet};

use std::cell::RefCell;

use proptest::prelude::*;
use proptest::sample::{Index, subsequence};
use proptest::test_runner::{Config, RngSeed, TestRunner};

use reservations_domain::capacity::{
    CapacityAction, CapacityPlan, CapacityRequest, CapacityTarget, plan_capacity_change,
};
use reservations_domain::placement::{RefusalReason, UnitClaim, UnitFacts, refusal_for_unit};
use reservations_domain::reservation::{
    MAX_UNITS_PER_REQUEST, Status, StoredState, Term, UnitIds, derive_status,
};
use reservations_domain::time::from_millis;
use reservations_domain::vm::{RunningVm, Tier};
use reservations_domain::{DomainError, Refusal};

/// Node units outside the reservation.
const OUTSIDE: usize = 3;
/// Ids a request may name that are not the reservation's.
const STRANGERS: [&str; 3] = ["x0", "x2", "zz"];
const AUDIENCE: &str = "aud";
const OUTSIDER: &str = "outsider";

#[derive(Debug, Clone, PartialEq)]
struct Vm {
    id: String,
    tier: Tier,
    units: BTreeSet<String>,
    running: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct World {
    reserved: Vec<String>,
    released: BTreeSet<String>,
    status: Status,
    vms: Vec<Vm>,
}

impl World {
    fn running(&self) -> impl Iterator<Item = &Vm> {
        self.vms.iter().filter(|vm| vm.running)
    }

    fn running_vms(&self) -> Vec<RunningVm> {
        self.running()
            .map(|vm| RunningVm {
                id: vm.id.clone(),
                org_id: format!("org-of-{}", vm.id),
                tier: vm.tier,
                unit_ids: vm.units.iter().cloned().collect(),
                terminates_at: None,
            })
            .collect()
    }

    /// What the component reads for a capacity request.
    fn target(&self, request: &[String]) -> CapacityTarget {
        CapacityTarget {
            status: self.status,
            term: Term {
                starts_at: from_millis(0),
                ends_at: None,
            },
            requested_units: request
                .iter()
                .filter(|u| self.reserved.contains(u))
                .cloned()
                .collect(),
        }
    }

    fn plan(
        &self,
        action: CapacityAction,
        request: &[String],
    ) -> Result<CapacityPlan, DomainError> {
        let units = UnitIds::check("unitIds", request, MAX_UNITS_PER_REQUEST)?;
        let asked = CapacityRequest::new(action, units, from_millis(1_000_000));
        plan_capacity_change(&asked, &self.target(request), &self.running_vms())
    }

    /// The state after a plan is carried out: its lists, written as they are.
    fn apply(&self, action: CapacityAction, plan: &CapacityPlan) -> World {
        let mut next = self.clone();
        if !action.writes() {
            return next;
        }
        next.released.extend(plan.released.iter().cloned());
        for unit in &plan.reclaimed {
            next.released.remove(unit);
        }
        for vm in &mut next.vms {
            if plan.stopped.iter().any(|stopped| stopped.vm_id == vm.id) {
                vm.running = false;
            }
        }
        next
    }

    /// What placement knows about one unit.
    fn facts(&self, unit: &str) -> UnitFacts {
        let reserved = self.reserved.iter().any(|u| u == unit);
        UnitFacts {
            unit_id: unit.to_owned(),
            on_node: true,
            running_vm: self
                .running()
                .find(|vm| vm.units.contains(unit))
                .map(|vm| vm.id.clone()),
            claims: reserved
                .then(|| UnitClaim {
                    reservation_id: "r1".to_owned(),
                    status: self.status,
                    released: self.released.contains(unit),
                    allowed_org_ids: vec![AUDIENCE.to_owned()],
                    party_org_ids: vec![AUDIENCE.to_owned()],
                })
                .into_iter()
                .collect(),
        }
    }

    /// Places a VM if placement allows every unit.
    fn place(&mut self, org: &str, tier: Tier, units: BTreeSet<String>) -> bool {
        let allowed = units
            .iter()
            .all(|u| refusal_for_unit(org, tier, &self.facts(u)).is_none());
        if allowed && !units.is_empty() {
            self.vms.push(Vm {
                id: format!("vm{}", self.vms.len()),
                tier,
                units,
                running: true,
            });
        }
        allowed
    }

    /// The invariants every state must keep.
    fn check_invariants(&self) -> Result<(), TestCaseError> {
        let mut occupied = BTreeSet::new();
        for vm in self.running() {
            for unit in &vm.units {
                prop_assert!(occupied.insert(unit), "two running VMs on {unit}");
                if vm.tier != Tier::Spot {
                    prop_assert!(
                        !self.released.contains(unit),
                        "{} VM {} on released unit {unit}",
                        vm.tier.as_str(),
                        vm.id
                    );
                }
            }
        }
        for unit in &self.released {
            prop_assert!(self.reserved.contains(unit), "released {unit} not reserved");
        }
        Ok(())
    }
}

fn unit_name(i: usize, reserved: usize) -> String {
    if i < reserved {
        format!("u{i}")
    } else {
        format!("x{}", i - reserved)
    }
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::Spot),
        Just(Tier::Community),
        Just(Tier::Verified)
    ]
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        8 => Just(Status::Active),
        1 => Just(Status::Pending),
        1 => Just(Status::Expired),
        1 => Just(Status::Cancelled),
        1 => Just(Status::NeedsReview),
    ]
}

fn action() -> impl Strategy<Value = CapacityAction> {
    prop_oneof![
        Just(CapacityAction::Release),
        Just(CapacityAction::Reclaim),
        Just(CapacityAction::ReclaimDryRun),
    ]
}

/// A world with `n` reserved units.
fn world_with(n: usize, status: impl Strategy<Value = Status>) -> impl Strategy<Value = World> {
    (
        prop::collection::vec(any::<bool>(), n),
        prop::collection::vec(
            (tier(), prop::collection::vec(0..n + OUTSIDE, 1..=3)),
            0..=6,
        ),
        status,
    )
        .prop_map(move |(released_mask, raw_vms, status)| {
            let reserved: Vec<String> = (0..n).map(|i| unit_name(i, n)).collect();
            let released: BTreeSet<String> = reserved
                .iter()
                .zip(&released_mask)
                .filter(|(_, r)| **r)
                .map(|(u, _)| u.clone())
                .collect();
            let mut taken = BTreeSet::new();
            let mut vms = Vec::new();
            for (tier, indices) in raw_vms {
                let units: BTreeSet<String> = indices
                    .into_iter()
                    .map(|i| unit_name(i, n))
                    .filter(|u| !taken.contains(u))
                    .filter(|u| tier == Tier::Spot || !released.contains(u))
                    .collect();
                if units.is_empty() {
                    continue;
                }
                taken.extend(units.iter().cloned());
                vms.push(Vm {
                    id: format!("vm{}", vms.len()),
                    tier,
                    units,
                    running: true,
                });
            }
            World {
                reserved,
                released,
                status,
                vms,
            }
        })
}

/// A request against a world of `n` reserved units: a shuffled subset, sometimes with a
/// stranger and sometimes with a repeat.
fn request_for(n: usize) -> impl Strategy<Value = Vec<String>> {
    let all: Vec<usize> = (0..n).collect();
    (
        subsequence(all, 0..=n).prop_shuffle(),
        prop::option::weighted(0.15, (0..STRANGERS.len(), any::<Index>())),
        prop::option::weighted(0.15, (any::<Index>(), any::<Index>())),
    )
        .prop_map(move |(subset, stranger, repeat)| {
            let mut request: Vec<String> = subset.into_iter().map(|i| unit_name(i, n)).collect();
            if let Some((k, at)) = stranger {
                let at = at.index(request.len() + 1);
                request.insert(at, STRANGERS[k].to_owned());
            }
            if let Some((which, at)) = repeat
                && !request.is_empty()
            {
                let unit = request[which.index(request.len())].clone();
                let at = at.index(request.len() + 1);
                request.insert(at, unit);
            }
            request
        })
}

fn world_and_request() -> impl Strategy<Value = (World, Vec<String>)> {
    (1usize..=8).prop_flat_map(|n| (world_with(n, status()), request_for(n)))
}

/// An active world and a request the rules accept for `action`: distinct units of the
/// reservation, at least one, and for a release none under a running community or verified VM.
fn world_and_accepted_request(
    action: CapacityAction,
) -> impl Strategy<Value = (World, Vec<String>)> {
    (1usize..=8)
        .prop_flat_map(|n| world_with(n, Just(Status::Active)))
        .prop_map(move |world| {
            let eligible: Vec<String> = world
                .reserved
                .iter()
                .filter(|u| {
                    action != CapacityAction::Release
                        || !world
                            .running()
                            .any(|vm| vm.tier != Tier::Spot && vm.units.contains(*u))
                })
                .cloned()
                .collect();
            (world, eligible)
        })
        .prop_filter("no unit can be released", |(_, eligible)| {
            !eligible.is_empty()
        })
        .prop_flat_map(|(world, eligible)| {
            let n = eligible.len();
            (Just(world), subsequence(eligible, 1..=n).prop_shuffle())
        })
}

/// Runs `property` over `cases` inputs (replaying the saved regressions first, as `proptest!`
/// does) and returns how many cases took each branch, as the property names them.
fn run_counting<S: Strategy>(
    cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> Result<Vec<&'static str>, TestCaseError>,
) -> BTreeMap<&'static str, usize> {
    let counts = RefCell::new(BTreeMap::new());
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        rng_seed: RngSeed::Fixed(property_seed()),
        ..Config::default()
    });
    let result = runner.run(&strategy, |input| {
        for branch in property(input)? {
            *counts.borrow_mut().entry(branch).or_default() += 1;
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    counts.into_inner()
}

/// Every branch in `wanted` was taken by at least `minimum` cases.
#[track_caller]
fn assert_coverage(counts: &BTreeMap<&'static str, usize>, wanted: &[&str], minimum: usize) {
    for branch in wanted {
        let taken = counts.get(branch).copied().unwrap_or(0);
        assert!(
            taken >= minimum,
            "only {taken} cases took the branch {branch:?} (at least {minimum} must): {counts:?}"
        );
    }
}

fn sorted_unique(ids: &[String]) -> bool {
    ids.windows(2).all(|w| w[0] < w[1])
}

/// The refusal the rules call for, computed independently of the crate.
fn expected_refusal(
    world: &World,
    action: CapacityAction,
    request: &[String],
) -> Option<DomainError> {
    if request.is_empty() {
        return Some(DomainError::invalid(
            "unitIds",
            "must name at least one unit",
        ));
    }
    let mut counts = BTreeMap::<&String, usize>::new();
    for unit in request {
        *counts.entry(unit).or_default() += 1;
    }
    let repeated: Vec<String> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(u, _)| (*u).clone())
        .collect();
    if !repeated.is_empty() {
        return Some(DomainError::DuplicateIds {
            field: "unitIds",
            ids: repeated,
        });
    }
    let strangers: Vec<String> = request
        .iter()
        .filter(|u| !world.reserved.contains(u))
        .cloned()
        .collect();
    if !strangers.is_empty() {
        return Some(DomainError::NotInReservation {
            unit_ids: strangers,
        });
    }
    if world.status != Status::Active {
        return Some(DomainError::NotActive {
            status: world.status,
        });
    }
    if action == CapacityAction::Release {
        let mut units = BTreeSet::new();
        let mut vm_ids = BTreeSet::new();
        for vm in world.running().filter(|vm| vm.tier != Tier::Spot) {
            for unit in vm.units.iter().filter(|u| request.contains(u)) {
                units.insert(unit.clone());
                vm_ids.insert(vm.id.clone());
            }
        }
        if !units.is_empty() {
            return Some(DomainError::UnitsNotIdle {
                unit_ids: units.into_iter().collect(),
                vm_ids: vm_ids.into_iter().collect(),
            });
        }
    }
    None
}

/// Compares refusals; an `Invalid` is compared by field only (its message is prose).
fn same_refusal(got: &DomainError, want: &DomainError) -> bool {
    match (got, want) {
        (DomainError::Invalid { field: a, .. }, DomainError::Invalid { field: b, .. }) => a == b,
        _ => got == want,
    }
}

/// How many cases each of the capacity properties runs: enough for every branch it counts.
const CASES: u32 = 1024;
/// The fewest cases a counted branch may get.
const MIN_BRANCH_CASES: usize = 20;

/// The name of a refusal's branch, for the coverage counts.
fn refusal_branch(refusal: &DomainError) -> &'static str {
    match refusal {
        DomainError::Invalid { .. } => "invalid (no unit)",
        DomainError::DuplicateIds { .. } => "duplicate ids",
        DomainError::NotInReservation { .. } => "not in reservation",
        DomainError::NotActive { .. } => "not active",
        DomainError::UnitsNotIdle { .. } => "units not idle",
        _ => "other refusal",
    }
}

/// A dry run is the reclaim it predicts: same refusal or same plan.
#[test]
fn dry_run_equals_reclaim() {
    let counts = run_counting(CASES, world_and_request(), |(world, request)| {
        let dry_run = world.plan(CapacityAction::ReclaimDryRun, &request);
        prop_assert_eq!(&dry_run, &world.plan(CapacityAction::Reclaim, &request));
        Ok(vec![match &dry_run {
            Ok(plan) if !plan.terminate.is_empty() && !plan.skip.is_empty() => {
                "terminates and skips"
            }
            Ok(_) => "plan",
            Err(_) => "refused",
        }])
    });
    assert_coverage(
        &counts,
        &["terminates and skips", "plan", "refused"],
        MIN_BRANCH_CASES,
    );
}

/// Requests are refused exactly when, and as, the rules say.
#[test]
fn refusals_are_exactly_the_rules() {
    let counts = run_counting(
        CASES,
        (world_and_request(), action()),
        |((world, request), action)| {
            world.check_invariants()?;
            let got = world.plan(action, &request);
            match (got, expected_refusal(&world, action, &request)) {
                (Ok(_), None) => Ok(vec!["accepted"]),
                (Err(got), Some(want)) => {
                    prop_assert!(same_refusal(&got, &want), "got {:?}, want {:?}", got, want);
                    let refusal = got.refusal();
                    prop_assert!(
                        refusal == Refusal::InvalidInput || refusal == Refusal::Conflict,
                        "{:?}",
                        refusal
                    );
                    Ok(vec![refusal_branch(&want)])
                }
                (got, want) => Err(TestCaseError::fail(format!(
                    "got {got:?}, want refusal {want:?}"
                ))),
            }
        },
    );
    assert_coverage(
        &counts,
        &[
            "accepted",
            "invalid (no unit)",
            "duplicate ids",
            "not in reservation",
            "not active",
            "units not idle",
        ],
        MIN_BRANCH_CASES,
    );
}

/// A reclaim leaves none of its units released and no spot VM on them, and touches nothing
/// else.
#[test]
fn reclaim_frees_the_requested_units() {
    let strategy = world_and_accepted_request(CapacityAction::Reclaim);
    let counts = run_counting(CASES, strategy, |(world, request)| {
        let plan = world.plan(CapacityAction::Reclaim, &request);
        prop_assert!(plan.is_ok(), "refused {:?}", plan);
        let plan = plan.unwrap();
        let after = world.apply(CapacityAction::Reclaim, &plan);
        let requested: BTreeSet<&String> = request.iter().collect();

        prop_assert!(plan.released.is_empty());
        prop_assert_eq!(&plan.reclaimed, &request);
        // Without notice, every spot VM terminated stops now.
        let stopped: Vec<&String> = plan.stopped.iter().map(|vm| &vm.vm_id).collect();
        prop_assert_eq!(stopped, plan.terminate.iter().collect::<Vec<_>>());
        prop_assert!(sorted_unique(&plan.terminate), "{:?}", plan.terminate);
        prop_assert!(sorted_unique(&plan.skip), "{:?}", plan.skip);

        for unit in &request {
            prop_assert!(!after.released.contains(unit), "{} still released", unit);
        }
        for unit in world.reserved.iter().filter(|u| !requested.contains(u)) {
            prop_assert_eq!(
                world.released.contains(unit),
                after.released.contains(unit),
                "{} changed",
                unit
            );
        }
        let mut spans_outside = false;
        for (before, now) in world.vms.iter().zip(&after.vms) {
            let touches = before.running && before.units.iter().any(|u| requested.contains(u));
            spans_outside |= touches && before.units.iter().any(|u| !world.reserved.contains(u));
            match (touches, before.tier) {
                (true, Tier::Spot) => {
                    prop_assert!(!now.running, "spot {} still runs", now.id);
                    prop_assert!(plan.terminate.contains(&before.id));
                }
                (true, _) => {
                    prop_assert_eq!(before, now);
                    prop_assert!(plan.skip.contains(&before.id));
                }
                (false, _) => {
                    prop_assert_eq!(before, now);
                    prop_assert!(!plan.terminate.contains(&before.id));
                    prop_assert!(!plan.skip.contains(&before.id));
                }
            }
        }
        prop_assert_eq!(
            plan.terminate.len() + plan.skip.len(),
            world
                .running()
                .filter(|vm| vm.units.iter().any(|u| requested.contains(u)))
                .count()
        );
        for vm in after.running() {
            prop_assert!(
                vm.tier != Tier::Spot || vm.units.iter().all(|u| !requested.contains(u)),
                "spot {} runs on a reclaimed unit",
                vm.id
            );
        }
        after.check_invariants()?;
        let mut branches = Vec::new();
        if !plan.terminate.is_empty() {
            branches.push("terminates");
        }
        if !plan.skip.is_empty() {
            branches.push("skips");
        }
        if request.iter().any(|u| world.released.contains(u)) {
            branches.push("reclaims released units");
        }
        if spans_outside {
            branches.push("a VM spans the reservation and other units");
        }
        Ok(branches)
    });
    assert_coverage(
        &counts,
        &[
            "terminates",
            "skips",
            "reclaims released units",
            "a VM spans the reservation and other units",
        ],
        MIN_BRANCH_CASES,
    );
}

/// A release puts exactly the requested units on the market, terminates nothing, and keeps
/// community and verified VMs off released units.
#[test]
fn release_keeps_non_spot_vms_off_released_units() {
    let strategy = world_and_accepted_request(CapacityAction::Release);
    let counts = run_counting(CASES, strategy, |(world, request)| {
        let plan = world.plan(CapacityAction::Release, &request);
        prop_assert!(plan.is_ok(), "refused {:?}", plan);
        let plan = plan.unwrap();
        let after = world.apply(CapacityAction::Release, &plan);
        prop_assert!(plan.terminate.is_empty() && plan.skip.is_empty());
        prop_assert!(plan.reclaimed.is_empty() && plan.stopped.is_empty());
        prop_assert_eq!(&plan.released, &request);
        let newly: Vec<&String> = request
            .iter()
            .filter(|u| !world.released.contains(*u))
            .collect();
        let expected: BTreeSet<String> = world.released.iter().chain(&request).cloned().collect();
        prop_assert_eq!(&after.released, &expected);
        prop_assert_eq!(&after.vms, &world.vms);
        after.check_invariants()?;
        // And placement keeps it so: no community or verified VM goes on a released unit.
        for unit in &after.released {
            for org in [AUDIENCE, OUTSIDER] {
                for tier in [Tier::Community, Tier::Verified] {
                    prop_assert!(refusal_for_unit(org, tier, &after.facts(unit)).is_some());
                }
            }
        }
        let mut branches = vec![if newly.is_empty() {
            "releases nothing new"
        } else {
            "releases units"
        }];
        if after
            .running()
            .any(|vm| vm.units.iter().any(|u| request.contains(u)))
        {
            branches.push("a spot VM runs on a released unit");
        }
        Ok(branches)
    });
    assert_coverage(
        &counts,
        &[
            "releases units",
            "releases nothing new",
            "a spot VM runs on a released unit",
        ],
        MIN_BRANCH_CASES,
    );
}

/// Release then reclaim of the same units gives the units back, whatever ran on them.
#[test]
fn release_then_reclaim_round_trips() {
    let strategy = world_and_accepted_request(CapacityAction::Release);
    let counts = run_counting(CASES, strategy, |(world, request)| {
        let released = world.plan(CapacityAction::Release, &request);
        prop_assert!(released.is_ok(), "release refused {:?}", released);
        let middle = world.apply(CapacityAction::Release, &released.unwrap());
        let reclaimed = middle.plan(CapacityAction::Reclaim, &request);
        prop_assert!(reclaimed.is_ok(), "{:?}", reclaimed);
        let reclaimed = reclaimed.unwrap();
        let after = middle.apply(CapacityAction::Reclaim, &reclaimed);
        let expected: BTreeSet<String> = world
            .released
            .iter()
            .filter(|u| !request.contains(u))
            .cloned()
            .collect();
        prop_assert_eq!(&after.released, &expected);
        prop_assert_eq!(&reclaimed.reclaimed, &request);
        Ok(vec![if reclaimed.terminate.is_empty() {
            "terminates nothing"
        } else {
            "terminates spot VMs"
        }])
    });
    assert_coverage(
        &counts,
        &["terminates nothing", "terminates spot VMs"],
        MIN_BRANCH_CASES,
    );
}

// ------------------------------------------------------------------------ placement

/// One reservation covering a unit, as generated: its status, whether the unit is released
/// in it, and whether the placing org is in its audience or otherwise one of its parties.
#[derive(Debug, Clone)]
struct ClaimSpec {
    status: Status,
    released: bool,
    audience: bool,
    party: bool,
}

/// A unit's facts with up to three claims: at most one active (active terms cannot overlap),
/// any number pending (after it), needs-review, expired or cancelled; the unit may have
/// left the node, and a VM may run on it.
fn unit_facts() -> impl Strategy<Value = UnitFacts> {
    let claim = (
        prop_oneof![
            3 => Just(Status::Active),
            3 => Just(Status::Pending),
            2 => Just(Status::NeedsReview),
            1 => Just(Status::Expired),
            1 => Just(Status::Cancelled),
        ],
        any::<bool>(),
        prop::bool::weighted(0.4),
        prop::bool::weighted(0.5),
    )
        .prop_map(|(status, released, audience, party)| ClaimSpec {
            status,
            released,
            audience,
            party: party || audience,
        });
    (
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.12),
        prop::collection::vec(claim, 0..=3),
    )
        .prop_map(|(on_node, busy, mut claims)| {
            let mut active_seen = false;
            for claim in &mut claims {
                if claim.status == Status::Active {
                    if active_seen {
                        claim.status = Status::Pending;
                    }
                    active_seen = true;
                }
            }
            UnitFacts {
                unit_id: "u0".to_owned(),
                on_node,
                running_vm: busy.then(|| "vm-0".to_owned()),
                claims: claims
                    .iter()
                    .enumerate()
                    .map(|(i, c)| UnitClaim {
                        reservation_id: format!("r{i}"),
                        status: c.status,
                        released: c.released,
                        allowed_org_ids: if c.audience {
                            vec![AUDIENCE.to_owned()]
                        } else {
                            vec!["someone-else".to_owned()]
                        },
                        party_org_ids: if c.party {
                            vec!["owner".to_owned(), AUDIENCE.to_owned()]
                        } else {
                            vec!["owner".to_owned()]
                        },
                    })
                    .collect(),
            }
        })
}

/// The placement rules (docs/design.md, "Placement") for one unit, written out
/// independently of the crate: a unit off the node, then a busy unit, then any needs-review claim, then the active claim, then a
/// pending one; a refusal caused by a reservation is only `unavailable` to an org that is no
/// party of it (the first claim of the deciding status is the one behind it).
fn placement_rule(facts: &UnitFacts, tier: Tier) -> Option<RefusalReason> {
    if !facts.on_node {
        return Some(RefusalReason::UnknownUnit);
    }
    if facts.running_vm.is_some() {
        return Some(RefusalReason::UnitBusy);
    }
    let first = |status: Status| facts.claims.iter().find(|c| c.status == status);
    let told = |claim: &UnitClaim, reason| {
        Some(if claim.party_org_ids.iter().any(|o| o == AUDIENCE) {
            reason
        } else {
            RefusalReason::Unavailable
        })
    };
    if let Some(withheld) = first(Status::NeedsReview) {
        return told(withheld, RefusalReason::WithheldNeedsReview);
    }
    if let Some(active) = first(Status::Active) {
        return match (active.released, tier) {
            (true, Tier::Spot) => None,
            (true, _) => Some(RefusalReason::ReleasedSpotOnly),
            (false, _) if active.allowed_org_ids.iter().any(|o| o == AUDIENCE) => None,
            (false, _) => told(active, RefusalReason::ReservedForAudience),
        };
    }
    match first(Status::Pending) {
        Some(pending) if tier != Tier::Spot => {
            told(pending, RefusalReason::FutureReservationSpotOnly)
        }
        _ => None,
    }
}

/// Who may place what on a unit, whatever reservations claim it, per docs/design.md, "Placement".
#[test]
fn placement_follows_the_design() {
    let counts = run_counting(4096, (unit_facts(), tier()), |(facts, tier)| {
        let got = refusal_for_unit(AUDIENCE, tier, &facts);
        prop_assert_eq!(got, placement_rule(&facts, tier), "{:?}", facts);
        let mut branches = vec![got.map_or("placed", RefusalReason::as_str)];
        let statuses: BTreeSet<Status> = facts.claims.iter().map(|c| c.status).collect();
        if statuses.contains(&Status::Active) && statuses.contains(&Status::Pending) {
            branches.push("active and pending claims");
        }
        if statuses.contains(&Status::NeedsReview) && statuses.len() > 1 {
            branches.push("needs-review beside another claim");
        }
        if !facts.on_node && !facts.claims.is_empty() {
            branches.push("a claimed unit that left the node");
        }
        Ok(branches)
    });
    assert_coverage(
        &counts,
        &[
            "placed",
            "unknown-unit",
            "unit-busy",
            "withheld-needs-review",
            "released-spot-only",
            "reserved-for-audience",
            "future-reservation-spot-only",
            "unavailable",
            "active and pending claims",
            "needs-review beside another claim",
            "a claimed unit that left the node",
        ],
        MIN_BRANCH_CASES,
    );
}

/// The world's own placement (one reservation, the audience or an outsider placing) agrees
/// with the rules too, reservation status by status.
#[test]
fn placement_in_a_world_follows_the_design() {
    // Every status equally often: the rare ones decide the rare refusals.
    let any_status = prop::sample::select(Status::ALL.to_vec());
    let strategy = (
        (1usize..=4).prop_flat_map(move |n| (world_with(n, any_status.clone()), 0..n + OUTSIDE)),
        tier(),
        any::<bool>(),
    );
    let counts = run_counting(2 * CASES, strategy, |((world, unit), tier, audience)| {
        let name = unit_name(unit, world.reserved.len());
        let facts = world.facts(&name);
        let org = if audience { AUDIENCE } else { OUTSIDER };
        let got = refusal_for_unit(org, tier, &facts);
        let reserved = world.reserved.contains(&name);
        let released = world.released.contains(&name);
        // The audience is a party of the reservation and learns why; the outsider is not,
        // and learns only that a unit the reservation holds is not available to it.
        let because_of_reservation = |reason| {
            Some(if audience {
                reason
            } else {
                RefusalReason::Unavailable
            })
        };
        let want = if facts.running_vm.is_some() {
            Some(RefusalReason::UnitBusy)
        } else if !reserved {
            None
        } else {
            match world.status {
                Status::NeedsReview => because_of_reservation(RefusalReason::WithheldNeedsReview),
                Status::Active if released => {
                    (tier != Tier::Spot).then_some(RefusalReason::ReleasedSpotOnly)
                }
                Status::Active if audience => None,
                Status::Active => because_of_reservation(RefusalReason::ReservedForAudience),
                Status::Pending if tier != Tier::Spot => {
                    because_of_reservation(RefusalReason::FutureReservationSpotOnly)
                }
                Status::Pending | Status::Expired | Status::Cancelled => None,
            }
        };
        prop_assert_eq!(got, want);
        Ok(vec![got.map_or("placed", RefusalReason::as_str)])
    });
    assert_coverage(
        &counts,
        &[
            "placed",
            "unit-busy",
            "withheld-needs-review",
            "released-spot-only",
            "future-reservation-spot-only",
            "unavailable",
        ],
        MIN_BRANCH_CASES,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any sequence of releases, reclaims, placements and stops on an active reservation keeps
    /// the invariants: one VM per unit, no community or verified VM on a released unit.
    #[test]
    fn invariants_hold_through_any_history(
        (world, ops) in (1usize..=6).prop_flat_map(|n| (
            world_with(n, Just(Status::Active)),
            prop::collection::vec(
                (0..4u8, request_for(n), tier(), any::<bool>(), any::<Index>()),
                1..=12,
            ),
        ))
    ) {
        let mut world = world;
        world.check_invariants()?;
        for (op, request, tier, audience, which) in ops {
            match op {
                0 | 1 => {
                    let action = if op == 0 {
                        CapacityAction::Release
                    } else {
                        CapacityAction::Reclaim
                    };
                    if let Ok(plan) = world.plan(action, &request) {
                        world = world.apply(action, &plan);
                    }
                }
                2 => {
                    let org = if audience { AUDIENCE } else { OUTSIDER };
                    let units: BTreeSet<String> = request
                        .into_iter()
                        .filter(|u| world.reserved.contains(u) || u.starts_with('x'))
                        .collect();
                    let released_unit = units.iter().any(|u| world.released.contains(u));
                    let placed = world.place(org, tier, units);
                    if released_unit && tier != Tier::Spot {
                        prop_assert!(!placed, "{} placed on a released unit", tier.as_str());
                    }
                }
                _ => {
                    if !world.vms.is_empty() {
                        let i = which.index(world.vms.len());
                        world.vms[i].running = false;
                    }
                }
            }
            world.check_invariants()?;
        }
    }

    /// Terms are half-open: they overlap exactly when some instant lies in both.
    #[test]
    fn overlap_is_a_shared_instant(
        a in (0i64..20, prop::option::of(1i64..12)),
        b in (0i64..20, prop::option::of(1i64..12)),
        now in -5i64..40,
    ) {
        let term = |(start, len): (i64, Option<i64>)| Term {
            starts_at: from_millis(start),
            ends_at: len.map(|l| from_millis(start + l)),
        };
        let (ta, tb) = (term(a), term(b));
        // Every finite term ends before 32, so an instant in both exists iff one exists below 40.
        let shared = (-5..40).any(|i| ta.contains(from_millis(i)) && tb.contains(from_millis(i)));
        prop_assert_eq!(ta.overlaps(&tb), shared);
        prop_assert_eq!(ta.overlaps(&tb), tb.overlaps(&ta));
        let status = derive_status(StoredState::Live, &ta, from_millis(now));
        prop_assert_eq!(status == Status::Active, ta.contains(from_millis(now)));
        prop_assert_eq!(status == Status::Pending, !ta.has_started(from_millis(now)));
        prop_assert_eq!(status == Status::Expired, ta.has_ended(from_millis(now)));
    }
}
