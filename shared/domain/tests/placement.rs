//! Placement, as docs/design.md, "Placement", states it:
//! - a unit runs at most one VM at a time;
//! - released unit: anyone, tier=spot only;
//! - reserved, not released, reservation active: only the audience;
//! - unit of a needs-review reservation: nobody;
//! - unit with a pending reservation: spot only;
//! - otherwise: anyone, any tier.

use reservations_domain::placement::{
    RefusalReason, UnitClaim, UnitFacts, UnitRefusal, placement_refusals, refusal_for_unit,
};
use reservations_domain::reservation::Status;
use reservations_domain::vm::Tier;

use RefusalReason::*;

const AUD: &str = "aud";
const OUTSIDER: &str = "outsider";
/// In `managingOrgIds` but not in the audience.
const MGR: &str = "mgr";
/// Owns the node.
const OWNER: &str = "owner";

fn claim(status: Status, released: bool) -> UnitClaim {
    UnitClaim {
        reservation_id: format!("r-{}", status.as_str()),
        status,
        released,
        allowed_org_ids: vec![AUD.to_owned()],
        party_org_ids: vec![OWNER.to_owned(), MGR.to_owned(), AUD.to_owned()],
    }
}

fn unit(claims: Vec<UnitClaim>) -> UnitFacts {
    UnitFacts {
        unit_id: "u1".to_owned(),
        on_node: true,
        running_vm: None,
        claims,
    }
}

/// Which unit is asked for in the table below.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// On the node, no VM, no live reservation.
    Free,
    /// Not on the node.
    Unknown,
    /// A VM runs on it (and it is otherwise free).
    Busy,
    /// Released by an active reservation.
    Released,
    /// Reserved by an active reservation, not released.
    Reserved,
    /// Reserved by a needs-review reservation.
    NeedsReview,
    /// Released, then its reservation went to needs-review.
    ReleasedNeedsReview,
    /// Reserved by a pending (future) reservation.
    Pending,
    /// Only expired and cancelled reservations cover it.
    Lapsed,
    /// Active and not released now, another reservation pending after it.
    ReservedThenPending,
    /// Released now, another reservation pending after it.
    ReleasedThenPending,
    /// Free of claims now, but a VM runs on a released unit.
    BusyReleased,
}

impl Unit {
    fn facts(self) -> UnitFacts {
        match self {
            Unit::Free => unit(vec![]),
            Unit::Unknown => UnitFacts {
                on_node: false,
                ..unit(vec![])
            },
            Unit::Busy => UnitFacts {
                running_vm: Some("vm-1".to_owned()),
                ..unit(vec![])
            },
            Unit::Released => unit(vec![claim(Status::Active, true)]),
            Unit::Reserved => unit(vec![claim(Status::Active, false)]),
            Unit::NeedsReview => unit(vec![claim(Status::NeedsReview, false)]),
            Unit::ReleasedNeedsReview => unit(vec![claim(Status::NeedsReview, true)]),
            Unit::Pending => unit(vec![claim(Status::Pending, false)]),
            Unit::Lapsed => unit(vec![
                claim(Status::Expired, false),
                claim(Status::Expired, true),
                claim(Status::Cancelled, false),
            ]),
            Unit::ReservedThenPending => unit(vec![
                claim(Status::Pending, false),
                claim(Status::Active, false),
            ]),
            Unit::ReleasedThenPending => unit(vec![
                claim(Status::Pending, false),
                claim(Status::Active, true),
            ]),
            Unit::BusyReleased => UnitFacts {
                running_vm: Some("vm-spot".to_owned()),
                ..unit(vec![claim(Status::Active, true)])
            },
        }
    }
}

const OK: Option<RefusalReason> = None;

/// unit × org → [spot, community, verified]; `None` = placed.
#[rustfmt::skip]
const TABLE: &[(Unit, &str, [Option<RefusalReason>; 3])] = &[
    //                                          spot                             community                        verified
    // Otherwise: anyone, any tier.
    (Unit::Free,                AUD,      [OK,                              OK,                              OK                             ]),
    (Unit::Free,                OUTSIDER, [OK,                              OK,                              OK                             ]),
    (Unit::Lapsed,              OUTSIDER, [OK,                              OK,                              OK                             ]),
    (Unit::Unknown,             AUD,      [Some(UnknownUnit),               Some(UnknownUnit),               Some(UnknownUnit)              ]),
    // One VM per unit, whoever asks.
    (Unit::Busy,                AUD,      [Some(UnitBusy),                  Some(UnitBusy),                  Some(UnitBusy)                 ]),
    (Unit::BusyReleased,        OUTSIDER, [Some(UnitBusy),                  Some(UnitBusy),                  Some(UnitBusy)                 ]),
    // Double sell: a released unit is sold to anyone, at spot only - the audience included.
    (Unit::Released,            OUTSIDER, [OK,                              Some(ReleasedSpotOnly),          Some(ReleasedSpotOnly)         ]),
    (Unit::Released,            AUD,      [OK,                              Some(ReleasedSpotOnly),          Some(ReleasedSpotOnly)         ]),
    (Unit::Released,            MGR,      [OK,                              Some(ReleasedSpotOnly),          Some(ReleasedSpotOnly)         ]),
    // Not released, active: the audience at any tier, nobody else at any tier.
    (Unit::Reserved,            AUD,      [OK,                              OK,                              OK                             ]),
    // Its parties learn why; an outsider only that the unit is not available to it.
    (Unit::Reserved,            OUTSIDER, [Some(Unavailable),               Some(Unavailable),               Some(Unavailable)              ]),
    (Unit::Reserved,            MGR,      [Some(ReservedForAudience),       Some(ReservedForAudience),       Some(ReservedForAudience)      ]),
    (Unit::Reserved,            OWNER,    [Some(ReservedForAudience),       Some(ReservedForAudience),       Some(ReservedForAudience)      ]),
    // needs-review withholds from everyone, released or not.
    (Unit::NeedsReview,         AUD,      [Some(WithheldNeedsReview),       Some(WithheldNeedsReview),       Some(WithheldNeedsReview)      ]),
    (Unit::NeedsReview,         OWNER,    [Some(WithheldNeedsReview),       Some(WithheldNeedsReview),       Some(WithheldNeedsReview)      ]),
    (Unit::NeedsReview,         OUTSIDER, [Some(Unavailable),               Some(Unavailable),               Some(Unavailable)              ]),
    (Unit::ReleasedNeedsReview, OUTSIDER, [Some(Unavailable),               Some(Unavailable),               Some(Unavailable)              ]),
    (Unit::ReleasedNeedsReview, MGR,      [Some(WithheldNeedsReview),       Some(WithheldNeedsReview),       Some(WithheldNeedsReview)      ]),
    // A future term: spot only, for anyone (its audience too), so it can be reclaimed.
    (Unit::Pending,             AUD,      [OK,                              Some(FutureReservationSpotOnly), Some(FutureReservationSpotOnly)]),
    (Unit::Pending,             OUTSIDER, [OK,                              Some(Unavailable),               Some(Unavailable)              ]),
    // The active reservation's rule comes first (the order of docs/design.md, "Placement").
    (Unit::ReservedThenPending, AUD,      [OK,                              OK,                              OK                             ]),
    (Unit::ReservedThenPending, OUTSIDER, [Some(Unavailable),               Some(Unavailable),               Some(Unavailable)              ]),
    (Unit::ReleasedThenPending, OUTSIDER, [OK,                              Some(ReleasedSpotOnly),          Some(ReleasedSpotOnly)         ]),
];

#[test]
fn placement_table() {
    let mut failures = Vec::new();
    for &(unit, org, per_tier) in TABLE {
        for (tier, want) in Tier::ALL.into_iter().zip(per_tier) {
            let got = refusal_for_unit(org, tier, &unit.facts());
            if got != want {
                failures.push(format!(
                    "{unit:?} for {org} at {}: got {got:?}, want {want:?}",
                    tier.as_str()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Refusals are checked in a fixed order: not on the node, busy, withheld, then the claims.
#[test]
fn refusal_precedence() {
    let everything = UnitFacts {
        unit_id: "u1".to_owned(),
        on_node: false,
        running_vm: Some("vm".to_owned()),
        claims: vec![
            claim(Status::NeedsReview, false),
            claim(Status::Active, true),
        ],
    };
    let mut facts = everything;
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Verified, &facts),
        Some(UnknownUnit)
    );
    facts.on_node = true;
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Verified, &facts),
        Some(UnitBusy)
    );
    facts.running_vm = None;
    assert_eq!(
        refusal_for_unit(MGR, Tier::Spot, &facts),
        Some(WithheldNeedsReview)
    );
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Spot, &facts),
        Some(Unavailable)
    );
    facts.claims.remove(0);
    assert_eq!(refusal_for_unit(OUTSIDER, Tier::Spot, &facts), None);
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Verified, &facts),
        Some(ReleasedSpotOnly)
    );
}

/// The double-sell story, in the order it happens on one unit.
#[test]
fn double_sell_story() {
    // The term has not started: the future audience cannot park a community VM on it.
    let pending = unit(vec![claim(Status::Pending, false)]);
    assert_eq!(
        refusal_for_unit(AUD, Tier::Community, &pending),
        Some(FutureReservationSpotOnly)
    );
    assert_eq!(refusal_for_unit(OUTSIDER, Tier::Spot, &pending), None);
    // Active: the audience's, at any tier; an outsider cannot buy it even at spot, and is
    // not told why (the reservation is none of its business).
    let active = unit(vec![claim(Status::Active, false)]);
    assert_eq!(refusal_for_unit(AUD, Tier::Verified, &active), None);
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Spot, &active),
        Some(Unavailable)
    );
    assert_eq!(
        refusal_for_unit(MGR, Tier::Spot, &active),
        Some(ReservedForAudience)
    );
    // Released: an outsider buys it at spot; a community request is never placed on it.
    let released = unit(vec![claim(Status::Active, true)]);
    assert_eq!(refusal_for_unit(OUTSIDER, Tier::Spot, &released), None);
    assert_eq!(
        refusal_for_unit(OUTSIDER, Tier::Community, &released),
        Some(ReleasedSpotOnly)
    );
    // The outsider's spot VM now occupies it.
    let occupied = UnitFacts {
        running_vm: Some("vm-spot".to_owned()),
        ..released
    };
    assert_eq!(refusal_for_unit(AUD, Tier::Spot, &occupied), Some(UnitBusy));
    // Topology changed: nobody, at any tier.
    let review = unit(vec![claim(Status::NeedsReview, true)]);
    for tier in Tier::ALL {
        for org in [AUD, OWNER, MGR] {
            assert_eq!(
                refusal_for_unit(org, tier, &review),
                Some(WithheldNeedsReview)
            );
        }
        assert_eq!(refusal_for_unit(OUTSIDER, tier, &review), Some(Unavailable));
    }
    // Expired: free for anyone.
    let expired = unit(vec![claim(Status::Expired, true)]);
    assert_eq!(refusal_for_unit(OUTSIDER, Tier::Verified, &expired), None);
}

#[test]
fn placement_refusals_lists_refused_units_in_request_order() {
    let named = |id: &str, u: Unit| UnitFacts {
        unit_id: id.to_owned(),
        ..u.facts()
    };
    let units = [
        named("u3", Unit::Reserved),
        named("u1", Unit::Free),
        named("u2", Unit::Released),
        named("u0", Unit::Unknown),
    ];
    assert_eq!(
        placement_refusals(OUTSIDER, Tier::Community, &units),
        vec![
            UnitRefusal::new("u3".to_owned(), Unavailable),
            UnitRefusal::new("u2".to_owned(), ReleasedSpotOnly),
            UnitRefusal::new("u0".to_owned(), UnknownUnit),
        ]
    );
    assert_eq!(
        placement_refusals(AUD, Tier::Spot, &units[..3]),
        vec![],
        "the audience may place a spot VM across its reserved, a free and a released unit"
    );
    assert_eq!(placement_refusals(AUD, Tier::Verified, &[]), vec![]);
}

#[test]
fn refusal_names() {
    #[rustfmt::skip]
    let names = [
        (UnknownUnit,               "unknown-unit"),
        (UnitBusy,                  "unit-busy"),
        (UnitUnderNotice,           "unit-under-notice"),
        (WithheldNeedsReview,       "withheld-needs-review"),
        (ReleasedSpotOnly,          "released-spot-only"),
        (ReservedForAudience,       "reserved-for-audience"),
        (FutureReservationSpotOnly, "future-reservation-spot-only"),
        (Unavailable,               "unavailable"),
    ];
    for (reason, name) in names {
        assert_eq!(reason.as_str(), name);
        assert_eq!(
            serde_json::to_string(&reason).unwrap(),
            format!("\"{name}\"")
        );
    }
    let refusal = UnitRefusal::new("u1".to_owned(), UnitBusy);
    assert_eq!(
        serde_json::to_value(&refusal).unwrap(),
        serde_json::json!({"unitId": "u1", "reason": "unit-busy"})
    );
    for tier in Tier::ALL {
        assert_eq!(Tier::parse(tier.as_str()), Some(tier));
    }
    assert_eq!(
        Tier::ALL.map(Tier::as_str),
        ["spot", "community", "verified"]
    );
}

#[test]
fn a_spot_vm_on_units_released_until_a_time_is_noticed_until_the_earliest_end() {
    use reservations_domain::notice::{InterruptionReason, placement_notice};
    use reservations_domain::time::from_millis;
    use std::collections::BTreeMap;

    let now = from_millis(1_000);
    let ends = BTreeMap::from([
        ("u1".to_owned(), (from_millis(9_000), "r-late".to_owned())),
        ("u2".to_owned(), (from_millis(5_000), "r-early".to_owned())),
        ("u3".to_owned(), (from_millis(5_000), "r-early".to_owned())),
    ]);
    let units = |list: &[&str]| list.iter().map(|u| u.to_string()).collect::<Vec<_>>();
    let notice = placement_notice(Tier::Spot, &ends, &units(&["u0", "u1", "u2", "u3"]), now)
        .expect("units released until a time give notice");
    assert_eq!(notice.reason, InterruptionReason::ReleaseEnds);
    assert_eq!(
        (notice.noticed_at, notice.terminates_at),
        (now, from_millis(5_000))
    );
    assert_eq!(notice.reservation_id, "r-early");
    assert_eq!(notice.unit_ids, units(&["u2", "u3"]));
    assert!(placement_notice(Tier::Spot, &ends, &units(&["u0"]), now).is_none());
    for tier in [Tier::Community, Tier::Verified] {
        assert!(placement_notice(tier, &ends, &units(&["u2"]), now).is_none());
    }
}

#[test]
fn a_node_update_may_not_take_away_a_unit_whose_vm_still_runs() {
    use reservations_domain::time::from_millis;
    use reservations_domain::topology::units_in_use;
    use std::collections::BTreeSet;

    let now = from_millis(5_000);
    let running = [
        ("u0".to_owned(), None),
        ("u1".to_owned(), Some(from_millis(6_000))),
        ("u2".to_owned(), Some(from_millis(5_000))),
        ("u3".to_owned(), None),
    ];
    let removed: BTreeSet<String> = ["u0", "u1", "u2"].iter().map(|u| u.to_string()).collect();
    let in_use: Vec<String> = units_in_use(&running, &removed, now).into_iter().collect();
    assert_eq!(in_use, ["u0", "u1"], "u2's notice ran out; u3 stays");
}
