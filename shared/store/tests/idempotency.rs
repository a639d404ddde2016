//! The idempotency protocol and the request transaction, natively over SQLite files: the
//! record and the writes it reports commit together or not at all, duplicates sent to two
//! replicas at once (two connections to one file) apply once, records expire and are swept
//! a few per request, and a transaction the database drops is never kept.

mod faults;

use std::sync::{Arc, Barrier};

use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::idempotency::{self, Begin, KeyedRequest, StoredResponse};
use reservations_store::native::NativeDb;
use reservations_store::{Context, StorageError, Store, StoreError};

use faults::Faulty;

const KEY_ID: &str = "operator";

fn response(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        content_type: "application/json".into(),
        body: body.into(),
        headers: vec![("x-request-id".into(), format!("req-{body}"))],
    }
}

fn keyed<'k>(key: &'k str, fingerprint: &str) -> KeyedRequest<'k> {
    KeyedRequest {
        caller_key_id: KEY_ID,
        idempotency_key: key,
        fingerprint: fingerprint.into(),
        now: from_millis(1_800_000_000_000),
    }
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
    Context {
        caller,
        now: from_millis(1_800_000_000_000),
        request_id,
        client_request_id: None,
    }
}

fn fresh<'s, 'a>(begin: Begin<'s, 'a>) -> idempotency::Guard<'s, 'a> {
    match begin {
        Begin::Fresh(guard) => guard,
        other => panic!("expected a fresh key, got {other:?}"),
    }
}

#[test]
fn the_record_and_the_writes_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let caller = operator();

    let guard = fresh(store.begin_idempotent(&keyed("k1", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    guard.finish(&response(201, "1")).unwrap();
    assert_eq!(count(&db, "orgs"), 1);
    match store.begin_idempotent(&keyed("k1", "fp")).unwrap() {
        Begin::Replay(stored) => assert_eq!(stored, response(201, "1")),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        store.begin_idempotent(&keyed("k1", "other")).unwrap(),
        Begin::Mismatch
    ));
    // Another caller's key of the same name is another key.
    let other_caller = KeyedRequest {
        caller_key_id: "key-2",
        ..keyed("k1", "fp")
    };
    drop(fresh(store.begin_idempotent(&other_caller).unwrap()));

    // The process "dies" before finishing: nothing of the request is kept, and the key is
    // fresh for its retry.
    let guard = fresh(store.begin_idempotent(&keyed("k2", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    drop(guard);
    assert_eq!(count(&db, "orgs"), 1, "the unfinished org is gone");
    assert_eq!(count(&db, "audit_events"), 1);
    let guard = fresh(store.begin_idempotent(&keyed("k2", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-3"), "globex", "Globex")
        .unwrap();
    guard.finish(&response(201, "3")).unwrap();
    assert_eq!(count(&db, "orgs"), 2);
    assert_eq!(count(&db, "idempotency_records"), 2);
}

#[test]
fn refusals_are_recorded_without_writes_and_failures_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let caller = operator();
    store
        .create_org(&ctx(&caller, "req-0"), "acme", "Acme")
        .unwrap();

    // A refusal that wrote nothing.
    let guard = fresh(store.begin_idempotent(&keyed("refused", "fp")).unwrap());
    assert!(
        store
            .create_org(&ctx(&caller, "req-1"), "acme", "Again")
            .is_err()
    );
    guard.finish(&response(409, "1")).unwrap();
    assert!(matches!(
        store.begin_idempotent(&keyed("refused", "fp")).unwrap(),
        Begin::Replay(stored) if stored.status == 409
    ));

    // A refusal after one of the request's writes was kept: the write goes.
    let guard = fresh(store.begin_idempotent(&keyed("half", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    guard.finish(&response(422, "2")).unwrap();
    assert_eq!(
        count(&db, "orgs"),
        1,
        "the refused request's write was rolled back"
    );
    assert!(matches!(
        store.begin_idempotent(&keyed("half", "fp")).unwrap(),
        Begin::Replay(stored) if stored.status == 422
    ));

    // A server failure is not recorded, and its writes go.
    let guard = fresh(store.begin_idempotent(&keyed("failed", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-3"), "initech", "Initech")
        .unwrap();
    guard.finish(&response(500, "3")).unwrap();
    assert_eq!(count(&db, "orgs"), 1);
    drop(fresh(
        store.begin_idempotent(&keyed("failed", "fp")).unwrap(),
    ));
    assert_eq!(count(&db, "idempotency_records"), 2);
}

#[test]
fn store_writes_join_the_request_transaction_each_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let caller = operator();
    let ctx = ctx(&caller, "req");
    let guard = fresh(store.begin_idempotent(&keyed("k", "fp")).unwrap());
    store.create_org(&ctx, "acme", "Acme").unwrap();
    // A refused write inside the transaction leaves the rest of it intact.
    assert!(store.create_org(&ctx, "acme", "Acme again").is_err());
    store.create_org(&ctx, "globex", "Globex").unwrap();
    assert_eq!(count(&db, "orgs"), 2);
    guard.finish(&response(201, "k")).unwrap();
    assert_eq!(count(&db, "orgs"), 2);

    // Outside a request transaction, writes commit on their own again.
    store.create_org(&ctx, "initech", "Initech").unwrap();
    let guard = fresh(store.begin_idempotent(&keyed("k2", "fp")).unwrap());
    store.create_org(&ctx, "hooli", "Hooli").unwrap();
    drop(guard);
    assert_eq!(count(&db, "orgs"), 3, "a dropped request writes nothing");
    assert_eq!(count(&db, "audit_events"), 3);
}

/// Two replicas (two connections to one database file) receive the same key at once, many
/// times over: each key's org is created once, and every other attempt replays its answer.
#[test]
fn duplicates_sent_to_two_replicas_at_once_apply_once() {
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
                    match store.begin_idempotent(&keyed(&key_name, "fp")).unwrap() {
                        Begin::Fresh(guard) => {
                            store
                                .create_org(
                                    &ctx(&caller, &request_id),
                                    &format!("org-{key}"),
                                    "Org",
                                )
                                .unwrap();
                            guard.finish(&response(201, &request_id)).unwrap();
                            applied += 1;
                        }
                        Begin::Replay(stored) => assert_eq!(stored.status, 201),
                        Begin::Mismatch => panic!("same fingerprint"),
                    }
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
}

#[test]
fn records_expire_and_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    for key in ["a", "b", "c", "d", "e"] {
        fresh(store.begin_idempotent(&keyed(key, "fp")).unwrap())
            .finish(&response(201, key))
            .unwrap();
    }
    // The retention passes for every record so far.
    db.connection()
        .execute(
            "UPDATE idempotency_records SET expires_at = expires_at - ?",
            [idempotency::RETENTION_MS + 1],
        )
        .unwrap();
    // An expired key is fresh again, even with another request.
    let guard = fresh(store.begin_idempotent(&keyed("a", "other")).unwrap());
    guard.finish(&response(201, "a2")).unwrap();
    // The new record swept two of the expired ones (a's own was replaced), the next one the
    // other two.
    assert_eq!(count(&db, "idempotency_records"), 3);
    fresh(store.begin_idempotent(&keyed("f", "fp")).unwrap())
        .finish(&response(201, "f"))
        .unwrap();
    assert_eq!(
        count(&db, "idempotency_records"),
        2,
        "only a2 and f are left"
    );
    assert!(matches!(
        store.begin_idempotent(&keyed("a", "other")).unwrap(),
        Begin::Replay(stored) if stored.body == "a2"
    ));
}

/// libSQL aborts a transaction that held the lock too long while another writer waited; its
/// next statement fails ("Transaction timed out") and the connection is back in autocommit.
/// Nothing the request does afterwards may be kept, and its record is not written.
#[test]
fn a_request_transaction_the_database_dropped_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    let guard = fresh(store.begin_idempotent(&keyed("k", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    db.drop_transaction_at_next("INSERT INTO audit_events");
    let refused = store.create_org(&ctx(&caller, "req-1"), "globex", "Globex");
    assert!(matches!(
        refused,
        Err(StoreError::Storage(StorageError::Busy(_)))
    ));
    assert!(guard.is_lost());
    // A handler that carried on regardless cannot write in autocommit.
    assert!(
        store
            .create_org(&ctx(&caller, "req-1"), "initech", "Initech")
            .is_err()
    );
    assert!(guard_finish_fails(guard));
    assert_eq!(db.count("orgs"), 0);
    assert_eq!(db.count("idempotency_records"), 0);
    // The request run again from the start applies once.
    let guard = fresh(store.begin_idempotent(&keyed("k", "fp")).unwrap());
    store
        .create_org(&ctx(&caller, "req-2"), "acme", "Acme")
        .unwrap();
    guard.finish(&response(201, "2")).unwrap();
    assert_eq!(db.count("orgs"), 1);
}

fn guard_finish_fails(guard: idempotency::Guard<'_, '_>) -> bool {
    guard
        .finish(&response(201, "x"))
        .is_err_and(|e| idempotency::is_transient(&e))
}

/// A write whose COMMIT fails transiently (the database dropped it, or the session
/// expired) is run again from the start, once, with nothing half-applied.
#[test]
fn write_transactions_are_run_again_after_transient_failures() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let caller = operator();
    db.drop_transaction_at_next("COMMIT");
    store
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    db.fail_next("INSERT INTO orgs", "Hrana: `api error: `{\"message\":\"The stream has expired due to inactivity\",\"code\":\"STREAM_EXPIRED\"}``");
    store
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    db.fail_next("BEGIN IMMEDIATE", "SQLite error: database is locked");
    store
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
    let outcome = store.create_org(&ctx(&caller, "req-1"), "acme", "Acme");
    assert!(
        matches!(
            outcome,
            Err(StoreError::Storage(StorageError::Unavailable(_)))
        ),
        "{outcome:?}"
    );
    assert!(matches!(
        store.begin_idempotent(&keyed("k", "fp")),
        Err(StoreError::Storage(StorageError::Unavailable(_)))
    ));
    db.heal();
    assert_eq!(db.count("orgs"), 0);
    store
        .create_org(&ctx(&caller, "req-2"), "acme", "Acme")
        .unwrap();
}
