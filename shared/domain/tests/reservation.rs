//! Reservation status, terms, and the checks on a new reservation.

use std::collections::BTreeSet;

use reservations_domain::reservation::{
    ExistingClaim, MAX_UNITS_PER_NODE, NewReservation, ReservationContext, Status, StoredState,
    Term, UnitIds, derive_status, reject_duplicates, validate_reservation,
};
use reservations_domain::time::{from_millis, parse_rfc3339, to_millis, to_rfc3339};
use reservations_domain::topology::{needs_review, next_topology_gen};
use reservations_domain::{DomainError, Refusal};
use reservations_domain::{Timestamp, UnitId};

/// `s` seconds after an arbitrary epoch.
fn t(s: i64) -> Timestamp {
    from_millis(1_900_000_000_000 + s * 1000)
}

fn term(start: i64, end: Option<i64>) -> Term {
    Term {
        starts_at: t(start),
        ends_at: end.map(t),
    }
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

// ---------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------

#[test]
fn status_follows_the_clock_at_the_boundaries() {
    let bounded = term(100, Some(200));
    let open = term(100, None);
    let one_ms = chrono::Duration::milliseconds(1);
    #[rustfmt::skip]
    let rows: &[(&Term, Timestamp, Status)] = &[
        (&bounded, t(0),            Status::Pending),
        (&bounded, t(100) - one_ms, Status::Pending),
        (&bounded, t(100),          Status::Active),  // exactly at startsAt
        (&bounded, t(150),          Status::Active),
        (&bounded, t(200) - one_ms, Status::Active),
        (&bounded, t(200),          Status::Expired), // exactly at endsAt
        (&bounded, t(10_000),       Status::Expired),
        (&open,    t(100) - one_ms, Status::Pending),
        (&open,    t(100),          Status::Active),
        (&open,    t(1_000_000_000), Status::Active), // open-ended never expires
    ];
    for &(term, now, want) in rows {
        assert_eq!(
            derive_status(StoredState::Live, term, now),
            want,
            "{term:?} at {now}"
        );
    }
}

#[test]
fn stored_states_win_over_the_clock() {
    for now in [t(0), t(100), t(150), t(200), t(300)] {
        for term in [term(100, Some(200)), term(100, None)] {
            assert_eq!(
                derive_status(StoredState::Cancelled, &term, now),
                Status::Cancelled
            );
            assert_eq!(
                derive_status(StoredState::NeedsReview, &term, now),
                Status::NeedsReview
            );
        }
    }
}

#[test]
fn term_predicates_at_the_boundaries() {
    let bounded = term(100, Some(200));
    assert!(!bounded.has_started(t(99)));
    assert!(bounded.has_started(t(100)));
    assert!(!bounded.has_ended(t(199)));
    assert!(bounded.has_ended(t(200)));
    assert!(!bounded.contains(t(99)));
    assert!(bounded.contains(t(100)));
    assert!(bounded.contains(t(199)));
    assert!(!bounded.contains(t(200)));
    let open = term(100, None);
    assert!(!open.has_ended(t(i64::from(i32::MAX))));
    assert!(open.contains(t(i64::from(i32::MAX))));
}

#[test]
fn status_names() {
    let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        names,
        ["pending", "active", "expired", "cancelled", "needs-review"]
    );
    for status in Status::ALL {
        assert_eq!(Status::parse(status.as_str()), Some(status));
        assert_eq!(
            serde_json::to_string(&status).unwrap(),
            format!("\"{}\"", status.as_str())
        );
    }
    assert_eq!(Status::parse("Active"), None);
    for state in [
        StoredState::Live,
        StoredState::Cancelled,
        StoredState::NeedsReview,
    ] {
        assert_eq!(StoredState::parse(state.as_str()), Some(state));
    }
}

// ---------------------------------------------------------------------------------------
// Overlap: half-open intervals [startsAt, endsAt), endsAt absent = forever
// ---------------------------------------------------------------------------------------

/// `(startsAt, endsAt)` in seconds; `None` = open-ended.
type Span = (i64, Option<i64>);

#[test]
fn overlaps_as_half_open_intervals() {
    #[rustfmt::skip]
    let rows: &[(Span, Span, bool)] = &[
        ((0, Some(10)),  (10, Some(20)), false), // back to back
        ((0, Some(10)),  (9, Some(20)),  true),  // one instant in common
        ((0, Some(10)),  (11, Some(20)), false), // a gap
        ((0, Some(10)),  (2, Some(5)),   true),  // containment
        ((0, Some(10)),  (0, Some(10)),  true),  // the same term
        ((0, Some(10)),  (-5, Some(0)),  false), // ends as the other starts
        ((0, Some(10)),  (-5, Some(1)),  true),
        ((0, None),      (10, Some(20)), true),  // open-ended covers every later term
        ((0, None),      (-10, Some(0)), false), // ...but not an earlier one
        ((0, None),      (-10, Some(1)), true),
        ((0, None),      (1_000, None),  true),  // two open-ended terms always meet
        ((5, None),      (0, Some(5)),   false),
    ];
    for &((a0, a1), (b0, b1), want) in rows {
        let (a, b) = (term(a0, a1), term(b0, b1));
        assert_eq!(a.overlaps(&b), want, "{a:?} vs {b:?}");
        assert_eq!(b.overlaps(&a), want, "{b:?} vs {a:?} (symmetry)");
    }
}

// ---------------------------------------------------------------------------------------
// validate_reservation
// ---------------------------------------------------------------------------------------

struct World {
    node_units: BTreeSet<UnitId>,
    orgs: BTreeSet<String>,
    claims: Vec<ExistingClaim>,
}

impl World {
    fn new() -> World {
        World {
            node_units: ids(&["u1", "u2", "u3", "u4"]).into_iter().collect(),
            orgs: ids(&["owner", "a", "b", "m"]).into_iter().collect(),
            claims: Vec::new(),
        }
    }

    fn claim(mut self, id: &str, units: &[&str], term: Term, state: StoredState) -> World {
        self.claims.push(ExistingClaim {
            reservation_id: id.to_owned(),
            unit_ids: ids(units),
            term,
            stored_state: state,
        });
        self
    }

    fn validate(&self, request: &NewReservation) -> Result<(), DomainError> {
        validate_reservation(
            request,
            &ReservationContext {
                node_unit_ids: &self.node_units,
                known_org_ids: &self.orgs,
                claims: &self.claims,
            },
        )
    }
}

fn request(units: &[&str], term: Term) -> NewReservation {
    NewReservation {
        reserved_unit_ids: ids(units),
        allowed_org_ids: ids(&["a", "b"]),
        managing_org_ids: ids(&["m"]),
        term,
        contract_ref: Some("c-1".to_owned()),
        reason: None,
    }
}

#[test]
fn a_well_formed_reservation_passes() {
    let world = World::new();
    assert_eq!(
        world.validate(&request(&["u1", "u2"], term(0, Some(10)))),
        Ok(())
    );
    assert_eq!(world.validate(&request(&["u4"], term(0, None))), Ok(()));
    let mut no_parties = request(&["u1"], term(0, None));
    no_parties.allowed_org_ids.clear();
    no_parties.managing_org_ids.clear();
    assert_eq!(world.validate(&no_parties), Ok(()));
}

#[test]
fn empty_and_oversized_unit_lists_are_invalid() {
    let world = World::new();
    let err = world.validate(&request(&[], term(0, None))).unwrap_err();
    assert!(
        matches!(
            err,
            DomainError::Invalid {
                field: "reservedUnitIds",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.refusal(), Refusal::InvalidInput);

    let mut huge = request(&[], term(0, None));
    huge.reserved_unit_ids = (0..=MAX_UNITS_PER_NODE).map(|i| format!("u{i}")).collect();
    let err = world.validate(&huge).unwrap_err();
    assert!(
        matches!(
            err,
            DomainError::Invalid {
                field: "reservedUnitIds",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn repeated_ids_are_refused_in_each_list() {
    let world = World::new();
    let err = world
        .validate(&request(&["u1", "u2", "u1", "u2", "u1"], term(0, None)))
        .unwrap_err();
    assert_eq!(
        err,
        DomainError::DuplicateIds {
            field: "reservedUnitIds",
            ids: ids(&["u1", "u2"])
        }
    );
    assert_eq!(err.refusal(), Refusal::InvalidInput);

    let mut r = request(&["u1"], term(0, None));
    r.allowed_org_ids = ids(&["b", "a", "b"]);
    assert_eq!(
        world.validate(&r),
        Err(DomainError::DuplicateIds {
            field: "allowedOrgIds",
            ids: ids(&["b"])
        })
    );

    let mut r = request(&["u1"], term(0, None));
    r.managing_org_ids = ids(&["m", "m"]);
    assert_eq!(
        world.validate(&r),
        Err(DomainError::DuplicateIds {
            field: "managingOrgIds",
            ids: ids(&["m"])
        })
    );

    // The same org in both lists is not a repeat.
    let mut r = request(&["u1"], term(0, None));
    r.managing_org_ids = ids(&["a"]);
    assert_eq!(world.validate(&r), Ok(()));
}

#[test]
fn the_term_must_end_after_it_starts() {
    let world = World::new();
    for end in [10, 9, -100] {
        let err = world
            .validate(&request(&["u1"], term(10, Some(end))))
            .unwrap_err();
        assert!(
            matches!(
                err,
                DomainError::Invalid {
                    field: "endsAt",
                    ..
                }
            ),
            "end {end}: {err:?}"
        );
        assert_eq!(err.refusal(), Refusal::InvalidInput);
    }
    assert_eq!(
        world.validate(&request(&["u1"], term(10, Some(11)))),
        Ok(())
    );
}

#[test]
fn units_must_be_on_the_node() {
    let world = World::new();
    let err = world
        .validate(&request(&["u9", "u1", "u0"], term(0, None)))
        .unwrap_err();
    assert_eq!(
        err,
        DomainError::UnknownUnits {
            unit_ids: ids(&["u9", "u0"])
        }
    );
    assert_eq!(err.refusal(), Refusal::InvalidInput);
}

#[test]
fn orgs_must_exist() {
    let world = World::new();
    let mut r = request(&["u1"], term(0, None));
    r.allowed_org_ids = ids(&["a", "zed", "ghost"]);
    r.managing_org_ids = ids(&["ghost", "m"]);
    let err = world.validate(&r).unwrap_err();
    assert_eq!(
        err,
        DomainError::UnknownOrgs {
            org_ids: ids(&["ghost", "zed"])
        },
        "each unknown org once, sorted"
    );
    assert_eq!(err.refusal(), Refusal::InvalidInput);
}

#[test]
fn checks_come_in_a_fixed_order() {
    let world = World::new().claim("r-old", &["u1"], term(0, None), StoredState::Live);
    // Every check fails: the unit list is reported first.
    let mut r = request(&["u1", "u1", "u9"], term(10, Some(5)));
    r.allowed_org_ids = ids(&["zed", "zed"]);
    r.managing_org_ids = ids(&["m", "m"]);
    let field = |e: DomainError| match e {
        DomainError::DuplicateIds { field, .. } | DomainError::Invalid { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(world.validate(&r).unwrap_err()), "reservedUnitIds");
    r.reserved_unit_ids = ids(&["u1", "u9"]);
    assert_eq!(field(world.validate(&r).unwrap_err()), "allowedOrgIds");
    r.allowed_org_ids = ids(&["zed"]);
    assert_eq!(field(world.validate(&r).unwrap_err()), "managingOrgIds");
    r.managing_org_ids = ids(&["m"]);
    assert_eq!(field(world.validate(&r).unwrap_err()), "endsAt");
    r.term = term(10, None);
    assert!(matches!(
        world.validate(&r),
        Err(DomainError::UnknownUnits { .. })
    ));
    r.reserved_unit_ids = ids(&["u1"]);
    // An overlap is reported before unknown orgs, so a request that fails anyway never
    // tells the caller whether an org it may not see exists.
    assert!(matches!(
        world.validate(&r),
        Err(DomainError::ReservationOverlap { .. })
    ));
    let world = World::new().claim("r-old", &["u1"], term(0, Some(5)), StoredState::Live);
    r.term = term(10, None);
    assert!(matches!(
        world.validate(&r),
        Err(DomainError::UnknownOrgs { .. })
    ));
    r.allowed_org_ids = ids(&["a"]);
    assert_eq!(world.validate(&r), Ok(()));
}

#[test]
fn overlapping_reservations_of_the_same_units_conflict() {
    let world = World::new()
        .claim("r-b", &["u2", "u3"], term(0, Some(100)), StoredState::Live)
        .claim("r-a", &["u1"], term(50, None), StoredState::NeedsReview)
        .claim("r-c", &["u4"], term(0, Some(100)), StoredState::Live);
    let err = world
        .validate(&request(&["u3", "u1", "u2"], term(60, Some(70))))
        .unwrap_err();
    assert_eq!(
        err,
        DomainError::ReservationOverlap {
            unit_ids: ids(&["u1", "u2", "u3"]),
            reservation_ids: ids(&["r-a", "r-b"]),
        },
        "names every conflicting unit and reservation, sorted; u4's reservation is not involved"
    );
    assert_eq!(err.refusal(), Refusal::Conflict);
    assert_eq!(err.code(), "reservation-overlap");

    // Only the units the request shares with the claim are named.
    let err = world
        .validate(&request(&["u3"], term(99, None)))
        .unwrap_err();
    assert_eq!(
        err,
        DomainError::ReservationOverlap {
            unit_ids: ids(&["u3"]),
            reservation_ids: ids(&["r-b"]),
        }
    );
}

#[test]
fn no_conflict_with_cancelled_or_disjoint_terms() {
    let world = World::new()
        .claim(
            "r-cancelled",
            &["u1"],
            term(0, None),
            StoredState::Cancelled,
        )
        .claim("r-before", &["u2"], term(0, Some(100)), StoredState::Live)
        .claim("r-after", &["u2"], term(200, None), StoredState::Live)
        .claim("r-other-units", &["u3"], term(0, None), StoredState::Live);
    // u2 is free in [100, 200): back to back on both sides.
    assert_eq!(
        world.validate(&request(&["u1", "u2"], term(100, Some(200)))),
        Ok(())
    );
    // An open-ended request from 100 runs into r-after.
    assert_eq!(
        world.validate(&request(&["u2"], term(100, None))),
        Err(DomainError::ReservationOverlap {
            unit_ids: ids(&["u2"]),
            reservation_ids: ids(&["r-after"]),
        })
    );
    // A cancelled claim never conflicts, even with a term that would overlap.
    assert_eq!(world.validate(&request(&["u1"], term(-50, None))), Ok(()));
}

// ---------------------------------------------------------------------------------------
// List helpers, topology, time
// ---------------------------------------------------------------------------------------

#[test]
fn unit_list_helpers() {
    assert!(UnitIds::check("unitIds", &ids(&["a"]), 1).is_ok());
    assert!(matches!(
        UnitIds::check("unitIds", &ids(&["a", "b"]), 1),
        Err(DomainError::Invalid {
            field: "unitIds",
            ..
        })
    ));
    assert!(matches!(
        UnitIds::check("unitIds", &[], 5),
        Err(DomainError::Invalid {
            field: "unitIds",
            ..
        })
    ));
    assert_eq!(reject_duplicates("x", &[]), Ok(()));
    assert_eq!(
        reject_duplicates("x", &ids(&["c", "a", "c", "a", "b"])),
        Err(DomainError::DuplicateIds {
            field: "x",
            ids: ids(&["a", "c"])
        })
    );
}

#[test]
fn topology_generation_moves_only_when_the_unit_set_changes() {
    let set = |l: &[&str]| ids(l).into_iter().collect::<BTreeSet<_>>();
    assert_eq!(
        next_topology_gen(3, &set(&["a", "b"]), &set(&["b", "a"])),
        3
    );
    assert_eq!(next_topology_gen(3, &set(&["a", "b"]), &set(&["a"])), 4);
    assert_eq!(next_topology_gen(3, &set(&["a"]), &set(&["a", "c"])), 4);
    assert_eq!(next_topology_gen(0, &set(&[]), &set(&[])), 0);
}

#[test]
fn needs_review_only_for_live_unfinished_reservations_behind_the_node() {
    let bounded = term(100, Some(200));
    #[rustfmt::skip]
    let rows: &[(StoredState, i64, i64, i64, bool)] = &[
        // state                  res gen node gen now  review?
        (StoredState::Live,        1,      2,       150, true),  // active
        (StoredState::Live,        1,      2,       50,  true),  // pending
        (StoredState::Live,        1,      2,       200, false), // expired at endsAt
        (StoredState::Live,        2,      2,       150, false), // up to date
        (StoredState::Cancelled,   1,      2,       150, false),
        (StoredState::NeedsReview, 1,      2,       150, false), // already
    ];
    for &(state, res_gen, node_gen, now, want) in rows {
        assert_eq!(
            needs_review(state, &bounded, res_gen, node_gen, t(now)),
            want,
            "{state:?} gen {res_gen}/{node_gen} at {now}"
        );
    }
    assert!(needs_review(
        StoredState::Live,
        &term(0, None),
        1,
        2,
        t(1_000_000)
    ));
}

#[test]
fn times_round_trip() {
    let at = parse_rfc3339("2030-01-02T03:04:05.678+02:00").unwrap();
    assert_eq!(to_rfc3339(at), "2030-01-02T01:04:05.678Z");
    assert_eq!(from_millis(to_millis(at)), at);
    assert_eq!(parse_rfc3339("2030-01-02 03:04:05"), None);
}

#[test]
fn times_are_kept_to_the_millisecond_the_store_keeps() {
    let first = parse_rfc3339("2030-01-02T03:04:05.0001Z").unwrap();
    let last = parse_rfc3339("2030-01-02T03:04:05.0009Z").unwrap();
    assert_eq!(first, last);
    assert_eq!(first, from_millis(to_millis(first)));
    assert_eq!(
        to_rfc3339(parse_rfc3339("1969-12-31T23:59:59.9999Z").unwrap()),
        "1969-12-31T23:59:59.999Z"
    );
}
