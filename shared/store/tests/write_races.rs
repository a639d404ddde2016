//! What a write planned on facts that changed before it landed answers. The write statement
//! re-checks the version of every fact its plan read; when one moved, the write is planned
//! again on the facts as they now are, so the caller hears the rules in its own terms, never
//! the database's.
//!
//! The races are made deterministic: an `Sql` that runs a concurrent writer's statement just
//! before the request's one write statement, and one that loses the answer of a write that
//! landed, as a dropped connection to a remote primary does.

mod acting;
mod faults;

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::error::DomainError;
use reservations_domain::unit_refusal::RefusalReason;
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::storage::Conflict;
use reservations_store::vms::NewVm;
use reservations_store::{Sql, SqlRows, SqlValue, StorageError, Store, StoreError};

use acting::{ctx, open_ended_reservation, org_key};
use faults::Faulty;

const CONNECTION_RESET: &str = "connection reset by peer";

/// An `Sql` that, once armed, runs `interleaved` before the next write statement, and
/// counts the write statements the database refused with `refusal`.
struct Interleaving {
    db: NativeDb,
    interleaved: RefCell<Option<String>>,
    refusal: Conflict,
    refused: Cell<usize>,
}

impl Sql for Interleaving {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let writes = statement.trim_start().starts_with("INSERT INTO writes");
        if writes && let Some(other) = self.interleaved.borrow_mut().take() {
            self.db.connection().execute_batch(&other).unwrap();
        }
        let result = self.db.execute(statement, params);
        if writes && matches!(&result, Err(StorageError::Conflict(c, _)) if *c == self.refusal) {
            self.refused.set(self.refused.get() + 1);
        }
        result
    }
}

/// Node `n1` of `owner` with `units`, all reserved by `r1` for `audience`, from the epoch and
/// open-ended.
fn reserve_node(store: &Store<'_>, units: &[String], audience: &[&str]) {
    let operator = Caller::operator("operator");
    store
        .capacity()
        .put_node(&ctx(&operator), "n1", "owner", units)
        .unwrap();
    store
        .capacity()
        .create_reservation(
            &ctx(&operator),
            "n1",
            "r1",
            &open_ended_reservation(
                units.to_vec(),
                audience.iter().map(|org| org.to_string()).collect(),
            ),
        )
        .unwrap();
}

/// A release or reclaim of `unit_ids` of `r1`, without a reason, notice or end.
fn capacity_change(
    action: CapacityAction,
    unit_ids: &[String],
    representation: Representation,
) -> CapacityChange<'_> {
    CapacityChange {
        action,
        node_id: "n1",
        reservation_id: "r1",
        unit_ids,
        reason: None,
        representation,
        notice_seconds: None,
        until: None,
    }
}

#[test]
fn a_review_that_starts_before_a_placement_lands_is_answered_in_the_callers_terms() {
    let dir = tempfile::tempdir().unwrap();
    let db = Interleaving {
        db: NativeDb::open(dir.path().join("db.sqlite")).unwrap(),
        interleaved: RefCell::new(None),
        refusal: Conflict::FactsMoved,
        refused: Cell::new(0),
    };
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    for org in ["owner", "research", "buyer"] {
        store
            .identity()
            .create_org(&ctx(&operator), org, org)
            .unwrap();
    }
    let units = ["g0".to_owned(), "g1".to_owned()];
    reserve_node(&store, &units, &["research"]);
    store
        .capacity()
        .change_capacity(
            &ctx(&operator),
            capacity_change(CapacityAction::Release, &units, Representation::Minimal),
        )
        .unwrap();
    let place = |org: &str, id: &str, unit: &str| {
        // A review starts between the plan (the unit on the spot market) and the write.
        *db.interleaved.borrow_mut() =
            Some("UPDATE reservations SET state = 'needs-review' WHERE id = 'r1'".into());
        let result = store.capacity().place_vm(
            &ctx(&org_key(org, Role::Member)),
            NewVm {
                id,
                node_id: "n1",
                unit_ids: &[unit.to_owned()],
                tier: Tier::Spot,
            },
        );
        db.db
            .connection()
            .execute_batch("UPDATE reservations SET state = 'live' WHERE id = 'r1'")
            .unwrap();
        result
    };
    let reasons = |result: Result<_, StoreError>| match result {
        Err(StoreError::Domain(DomainError::PlacementRefused { refusals })) => refusals
            .into_iter()
            .map(|refusal| refusal.reason)
            .collect::<Vec<_>>(),
        other => panic!("a refused placement, not {other:?}"),
    };

    // A spot buyer is no party of the reservation: it hears the unit is unavailable, not
    // that the reservation is under review.
    let refused = reasons(place("buyer", "vm-1", "g0"));
    assert_eq!(refused, [RefusalReason::Unavailable]);
    assert_eq!(db.refused.get(), 1, "the first write found its facts moved");

    // The audience is a party: it hears why.
    let refused = reasons(place("research", "vm-2", "g1"));
    assert_eq!(refused, [RefusalReason::WithheldNeedsReview]);
    assert_eq!(db.refused.get(), 2);
}

#[test]
fn a_write_whose_answer_was_lost_after_it_landed_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    store
        .identity()
        .create_org(&ctx(&operator), "owner", "Owner")
        .unwrap();
    let units = ["g0".to_owned(), "g1".to_owned()];
    store
        .capacity()
        .put_node(&ctx(&operator), "n1", "owner", &units)
        .unwrap();
    let events = db.count("audit_events");
    db.lose_answer_of_next("INSERT INTO writes", CONNECTION_RESET);
    store
        .capacity()
        .put_node(&ctx(&operator), "n1", "owner", &units)
        .expect("the write landed: its answer is the one it would have had");
    assert_eq!(db.injected(), 1, "the answer was lost");
    assert_eq!(
        db.count("audit_events"),
        events + 1,
        "the node's update is recorded once, not twice"
    );
    // The org created with its answer lost is created once, and the caller hears so.
    db.lose_answer_of_next("INSERT INTO writes", CONNECTION_RESET);
    store
        .identity()
        .create_org(&ctx(&operator), "tenant", "Tenant")
        .expect("created, not refused as a duplicate of itself");
    assert_eq!(db.injected(), 2);
}

#[test]
fn writes_conflict_only_when_one_changed_what_the_other_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    store
        .identity()
        .create_org(&ctx(&operator), "owner", "Owner")
        .unwrap();
    let units: Vec<String> = (0..4).map(|i| format!("g{i}")).collect();
    reserve_node(&store, &units, &[]);
    let release = |unit: &str, representation| {
        store
            .capacity()
            .change_capacity(
                &ctx(&operator),
                capacity_change(CapacityAction::Release, &[unit.to_owned()], representation),
            )
            .unwrap();
        store.write_attempts()
    };
    let another_release = |unit: &str| {
        format!(
            "UPDATE reservation_units SET released = 1 WHERE reservation_id = 'r1' AND unit_id = '{unit}'"
        )
    };
    // Another unit of the same reservation released meanwhile, and an event appended to the
    // node's chain: nothing this release read moved.
    db.meanwhile("INSERT INTO writes", &another_release("g1"), 1);
    assert_eq!(release("g0", Representation::Minimal), 1);
    db.append_to_chain_before("INSERT INTO writes", "node:n1", 1);
    assert_eq!(release("g2", Representation::Minimal), 1);
    // The same unit changed meanwhile: a real conflict, planned again.
    db.meanwhile(
        "INSERT INTO writes",
        "UPDATE reservation_units SET released = 0 WHERE reservation_id = 'r1' AND unit_id = 'g3'",
        1,
    );
    assert_eq!(release("g3", Representation::Minimal), 2);
    // An answer with the reservation's unit lists depends on every unit of it.
    db.meanwhile(
        "INSERT INTO writes",
        "UPDATE reservation_units SET released = 0 WHERE reservation_id = 'r1' AND unit_id = 'g1'",
        1,
    );
    assert_eq!(release("g0", Representation::Full), 2);
    assert_eq!(db.injected(), 4);
}

/// `writers` threads, each with its own connection, each writing `writes` times: a release
/// and the reclaim that undoes it, alternately, of `unit(writer)`. Returns the attempts of
/// every write.
fn race_on_units(writers: usize, writes: usize, unit: fn(usize) -> String) -> Vec<u32> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let db = NativeDb::open(&path).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    store
        .identity()
        .create_org(&ctx(&operator), "owner", "Owner")
        .unwrap();
    let units: Vec<String> = (0..writers)
        .map(unit)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    reserve_node(&store, &units, &[]);
    let barrier = std::sync::Barrier::new(writers);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..writers)
            .map(|writer| {
                let (path, barrier) = (&path, &barrier);
                scope.spawn(move || {
                    let db = NativeDb::open(path).unwrap();
                    let store = Store::open(&db).unwrap();
                    let operator = Caller::operator("operator");
                    let unit = [unit(writer)];
                    barrier.wait();
                    (0..writes)
                        .map(|i| {
                            let action = match i % 2 {
                                0 => CapacityAction::Release,
                                _ => CapacityAction::Reclaim,
                            };
                            let outcome = store.capacity().change_capacity(
                                &ctx(&operator),
                                capacity_change(action, &unit, Representation::Minimal),
                            );
                            assert!(outcome.is_ok(), "{outcome:?}");
                            store.write_attempts()
                        })
                        .collect::<Vec<u32>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

fn report(what: &str, mut attempts: Vec<u32>) -> Vec<u32> {
    attempts.sort_unstable();
    let at = |q: f64| attempts[((attempts.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "{what}: {} writes, attempts per write p50 {}, p99 {}, max {}",
        attempts.len(),
        at(0.5),
        at(0.99),
        attempts[attempts.len() - 1]
    );
    attempts
}

#[test]
fn writers_on_one_unit_take_turns_and_writers_on_different_units_never_meet() {
    let writers: usize = std::env::var("RACE_WRITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let writes = 10;
    // Every writer on its own unit of one reservation: no write plans twice.
    let apart = report(
        "different units",
        race_on_units(writers, writes, |w| format!("g{w}")),
    );
    assert!(apart.iter().all(|&a| a == 1), "{apart:?}");
    // Every writer on the same unit: a real conflict each time another commits first; each
    // write gets its turn well within its attempts, none refused.
    let together = report(
        "one unit",
        race_on_units(writers, writes, |_| "g0".to_owned()),
    );
    assert!(
        together.iter().sum::<u32>() > together.len() as u32,
        "the writers on one unit conflicted: {together:?}"
    );
    assert!(
        together
            .iter()
            .all(|&a| a < reservations_store::storage::WRITE_ATTEMPTS),
        "{together:?}"
    );
}

#[test]
fn a_write_whose_answer_was_lost_and_every_look_after_fails_is_reported_unavailable_and_landed_once()
 {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    db.lose_answer_of_next("INSERT INTO writes", CONNECTION_RESET);
    db.fail_always_after_next_fault(CONNECTION_RESET);
    let outcome = store
        .identity()
        .create_org(&ctx(&operator), "owner", "Owner");
    // The write landed, but no look could say so: the caller hears the store was out of
    // reach (a 503 with Retry-After), and retries with its Idempotency-Key.
    assert!(
        matches!(
            &outcome,
            Err(StoreError::Storage(StorageError::Unavailable(_)))
        ),
        "{outcome:?}"
    );
    assert!(
        db.injected() >= 2,
        "the answer was lost and the looks failed"
    );
    db.heal();
    assert_eq!(db.count("orgs"), 1, "applied once");
    assert_eq!(db.count("audit_events"), 1);
}
