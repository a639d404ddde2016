//! The write path and the idempotency protocol, natively over SQLite files: a mutation is one
//! statement that also writes its idempotency record, so the two commit together or not at
//! all; a write planned on facts that moved is planned again (and past a bound refused, with
//! nothing written); duplicates sent to three replicas at once (three connections to one
//! file) apply once; records expire and are swept a few per request; transient failures are
//! run again and an unreachable store is reported.

mod faults;

use std::sync::{Arc, Barrier};

use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::idempotency::{self, KeyedRequest, Lookup, StoredResponse};
use reservations_store::native::NativeDb;
use reservations_store::orgs::Org;
use reservations_store::storage::WRITE_ATTEMPTS;
use reservations_store::write::{WriteAttempts, Written};
use reservations_store::{Context, StorageError, Store, StoreError};

use faults::Faulty;

const KEY_ID: &str = "operator";

fn keyed<'k>(key: &'k str, fingerprint: &str) -> KeyedRequest<'k> {
    KeyedRequest {
        caller_key_id: KEY_ID,
        idempotency_key: key,
        fingerprint: fingerprint.into(),
        now: from_millis(1_800_000_000_000),
    }
}

fn response(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        content_type: "application/json".into(),
        body: body.into(),
        headers: vec![("x-request-id".into(), format!("req-{body}"))],
    }
}

/// An org's creation, answered `201` with the org's id as the body.
fn org_created(org: &Org) -> StoredResponse {
    response(201, &org.id)
}

fn count(db: &NativeDb, table: &str) -> i64 {
    db.connection()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

fn operator() -> Caller {
    Caller::operator(KEY_ID)
}

fn ctx<'a>(caller: &'a Caller, request_id: &'a str) -> Context<'a> {
    Context::new(caller, from_millis(1_800_000_000_000), request_id)
}

/// An org's creation under the keyed request `request`, its write recording
/// [`org_created`], as the request layer carries it out: what it answered, and whether its
/// write recorded the answer.
fn create_org_recording(
    store: &Store<'_>,
    caller: &Caller,
    request_id: &str,
    request: &KeyedRequest<'_>,
    (id, name): (&str, &str),
) -> (Result<Org, StoreError>, bool) {
    let ctx = ctx(caller, request_id);
    let mut attempts = WriteAttempts::default();
    loop {
        let planned = match store.identity().plan_create_org(&ctx, id, name) {
            Ok(planned) => planned,
            Err(e) => return (Err(e), false),
        };
        let writes = planned.write.is_some();
        let record = (request, org_created(&planned.outcome));
        match store.write(&ctx, planned, Some(record), &mut attempts) {
            Ok(Written::Done(org)) => return (Ok(org), writes),
            Ok(Written::PlanAgain) => {}
            Err(e) => return (Err(e), false),
        }
    }
}

#[test]
fn the_record_is_written_by_the_mutation_itself() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let caller = operator();
    assert_eq!(store.look_up(&keyed("k1", "fp")).unwrap(), Lookup::Fresh);
    let record = keyed("k1", "fp");
    let (created, recorded) =
        create_org_recording(&store, &caller, "req-1", &record, ("acme", "Acme"));
    created.unwrap();
    assert!(recorded);
    assert_eq!(store.write_attempts(), 1);
    assert_eq!(
        store.look_up(&keyed("k1", "fp")).unwrap(),
        Lookup::Replay(response(201, "acme"))
    );
    assert_eq!(
        store.look_up(&keyed("k1", "other")).unwrap(),
        Lookup::Mismatch
    );
    // Keys are the calling key's own.
    let other_caller = KeyedRequest {
        caller_key_id: "someone-else",
        ..keyed("k1", "fp")
    };
    assert_eq!(store.look_up(&other_caller).unwrap(), Lookup::Fresh);
    // A second request with the key, carried out meanwhile, is refused whole by its write:
    // it finds the record and replays it instead.
    let duplicate = keyed("k1", "fp");
    let (refused, recorded) =
        create_org_recording(&store, &caller, "req-2", &duplicate, ("globex", "Globex"));
    assert!(
        matches!(refused, Err(StoreError::AlreadyRecorded)),
        "{refused:?}"
    );
    assert!(!recorded);
    assert_eq!(count(&db, "orgs"), 1);
    assert_eq!(count(&db, "audit_events"), 1);
    assert_eq!(count(&db, "idempotency_records"), 1);
}

#[test]
fn refusals_are_recorded_on_their_own_unless_the_key_was_recorded_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let caller = operator();
    store
        .identity()
        .create_org(&ctx(&caller, "req-0"), "acme", "Acme")
        .unwrap();
    let record = keyed("again", "fp");
    let (refused, recorded) =
        create_org_recording(&store, &caller, "req-1", &record, ("acme", "Acme"));
    assert!(matches!(refused, Err(StoreError::Domain(_))), "{refused:?}");
    assert!(!recorded, "a refusal writes nothing");
    assert!(
        store
            .record_refusal(&keyed("again", "fp"), &response(409, "exists"))
            .unwrap()
    );
    assert_eq!(
        store.look_up(&keyed("again", "fp")).unwrap(),
        Lookup::Replay(response(409, "exists"))
    );
    // A record already there stays: the second refusal is not recorded over it.
    assert!(
        !store
            .record_refusal(&keyed("again", "fp"), &response(409, "later"))
            .unwrap()
    );
    assert_eq!(count(&db, "orgs"), 1);
}

#[test]
fn a_look_up_replays_the_record_refuses_another_request_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    assert_eq!(store.look_up(&keyed("k", "fp")).unwrap(), Lookup::Fresh);
    assert!(
        store
            .record_refusal(&keyed("k", "fp"), &response(409, "k"))
            .unwrap()
    );
    assert_eq!(
        store.look_up(&keyed("k", "fp")).unwrap(),
        Lookup::Replay(response(409, "k"))
    );
    assert_eq!(
        store.look_up(&keyed("k", "other")).unwrap(),
        Lookup::Mismatch
    );
    assert_eq!(count(&db, "idempotency_records"), 1);
}

#[test]
fn a_write_planned_on_facts_that_moved_is_planned_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    db.move_fact_before("INSERT INTO writes", r#"["org","acme"]"#, 2);
    store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    assert_eq!(store.write_attempts(), 3, "two conflicts, then the write");
    assert_eq!(db.count("orgs"), 1);
    // Writes that changed other facts do not conflict with it, nor do events another write
    // appended to its chain meanwhile.
    db.move_fact_before("INSERT INTO writes", r#"["org","initech"]"#, 1);
    store
        .identity()
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    assert_eq!(store.write_attempts(), 1);
    db.append_to_chain_before("INSERT INTO writes", "platform", 1);
    store
        .identity()
        .create_org(&ctx(&caller, "req-3"), "hooli", "Hooli")
        .unwrap();
    assert_eq!(store.write_attempts(), 1);
    assert_eq!(db.injected(), 4);
}

#[test]
fn a_write_whose_facts_keep_moving_is_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    db.move_fact_before(
        "INSERT INTO writes",
        r#"["org","acme"]"#,
        WRITE_ATTEMPTS as usize,
    );
    let outcome = store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme");
    assert!(
        matches!(outcome, Err(StoreError::Contention { attempts }) if attempts == WRITE_ATTEMPTS),
        "{outcome:?}"
    );
    assert_eq!(db.count("orgs"), 0);
    assert_eq!(db.count("idempotency_records"), 0);
    assert_eq!(db.injected(), WRITE_ATTEMPTS as usize);
}

#[test]
fn duplicates_sent_to_three_replicas_at_once_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    Store::open(&NativeDb::open(&path).unwrap()).unwrap();
    let keys: usize = std::env::var("IDEMPOTENCY_RACE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let replicas = 3;
    let barrier = Arc::new(Barrier::new(replicas));
    let workers: Vec<_> = (0..replicas)
        .map(|replica| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let db = NativeDb::open(&path).unwrap();
                let store = Store::keyed(&db, b"").unwrap();
                let caller = operator();
                let mut applied = 0;
                for key in 0..keys {
                    barrier.wait();
                    let key_name = format!("k{key}");
                    let request_id = format!("req-{replica}-{key}");
                    // What the request layer does: look up, carry out, and on losing the
                    // race (the key recorded, or the org created, meanwhile) look up again.
                    if store.look_up(&keyed(&key_name, "fp")).unwrap() == Lookup::Fresh {
                        let record = keyed(&key_name, "fp");
                        let org = format!("org-{key}");
                        match create_org_recording(
                            &store,
                            &caller,
                            &request_id,
                            &record,
                            (&org, "Org"),
                        )
                        .0
                        {
                            Ok(_) => applied += 1,
                            Err(StoreError::AlreadyRecorded | StoreError::Domain(_)) => {}
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                    assert!(matches!(
                        store.look_up(&keyed(&key_name, "fp")).unwrap(),
                        Lookup::Replay(stored) if stored.status == 201
                    ));
                }
                applied
            })
        })
        .collect();
    let applied: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(applied, keys, "each key applied exactly once");
    let db = NativeDb::open(&path).unwrap();
    assert_eq!(count(&db, "orgs"), keys as i64);
    assert_eq!(count(&db, "audit_events"), keys as i64);
    assert_eq!(count(&db, "idempotency_records"), keys as i64);
}

#[test]
fn records_expire_and_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    for key in ["a", "b", "c", "d", "e"] {
        assert!(
            store
                .record_refusal(&keyed(key, "fp"), &response(409, key))
                .unwrap()
        );
    }
    // The retention passes for every record so far.
    db.connection()
        .execute(
            "UPDATE idempotency_records SET expires_at = expires_at - ?",
            [idempotency::RETENTION_MS + 1],
        )
        .unwrap();
    // An expired key is fresh again, even with another request, and its write replaces it.
    assert_eq!(store.look_up(&keyed("a", "other")).unwrap(), Lookup::Fresh);
    let caller = operator();
    let record = keyed("a", "other");
    create_org_recording(&store, &caller, "req-1", &record, ("a2", "A2"))
        .0
        .unwrap();
    // The new record swept two of the expired ones (a's own was replaced), the next one the
    // other two.
    assert_eq!(count(&db, "idempotency_records"), 3);
    store
        .record_refusal(&keyed("f", "fp"), &response(409, "f"))
        .unwrap();
    assert_eq!(
        count(&db, "idempotency_records"),
        2,
        "only a2 and f are left"
    );
    assert!(matches!(
        store.look_up(&keyed("a", "other")).unwrap(),
        Lookup::Replay(stored) if stored.body == "a2"
    ));
}

/// A write that fails transiently (the database was locked, the session expired) is run
/// again, once, with nothing half-applied.
#[test]
fn writes_are_run_again_after_transient_failures() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    db.fail_next("INSERT INTO writes", "SQLite error: database is locked");
    store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    db.fail_next("INSERT INTO writes", "Hrana: `api error: `{\"message\":\"The stream has expired due to inactivity\",\"code\":\"STREAM_EXPIRED\"}``");
    store
        .identity()
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    db.fail_next("SELECT", "SQLite error: database is locked");
    store
        .identity()
        .create_org(&ctx(&caller, "req-3"), "initech", "Initech")
        .unwrap();
    assert_eq!(db.count("orgs"), 3);
    assert_eq!(
        db.count("audit_events"),
        3,
        "one event per org: nothing applied twice"
    );
    assert_eq!(db.injected(), 3);
}

/// An unreachable store is given up on after a few attempts, as `Unavailable` (503 with
/// `Retry-After`), not waited for.
#[test]
fn an_unreachable_store_is_reported_as_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    db.fail_always("error trying to connect: tcp connect error: Connection refused (os error 111)");
    let outcome = store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme");
    assert!(
        matches!(
            outcome,
            Err(StoreError::Storage(StorageError::Unavailable(_)))
        ),
        "{outcome:?}"
    );
    assert!(matches!(
        store.look_up(&keyed("k", "fp")),
        Err(StoreError::Storage(StorageError::Unavailable(_)))
    ));
    db.heal();
    assert_eq!(db.count("orgs"), 0);
    store
        .identity()
        .create_org(&ctx(&caller, "req-2"), "acme", "Acme")
        .unwrap();
    assert_eq!(db.count("orgs"), 1);
}
