//! Idempotency records and the request transaction, natively over SQLite files: a record is
//! replayed only when the mutation it reports is committed; the store's writes join the
//! request transaction (each all-or-nothing on its own) and go with it.

use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::idempotency::{self, CommitMark, Recall, StoredResponse};
use reservations_store::native::{NativeDb, NativeKv};
use reservations_store::{Context, Store};

const KEY_ID: &str = "operator";

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        content_type: "application/json".into(),
        body: body.into(),
        headers: Vec::new(),
    }
}

fn org_count(db: &NativeDb) -> i64 {
    db.connection()
        .query_row("SELECT count(*) FROM orgs", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_record_is_replayed_only_when_its_mutation_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let kv = NativeKv::open(dir.path().join("kv.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator(KEY_ID);
    let now = from_millis(1_800_000_000_000);
    let ctx = |request_id| Context {
        caller: &operator,
        now,
        request_id,
        client_request_id: None,
    };
    let recall = |key: &str| {
        idempotency::recall(&kv, KEY_ID, key, "fp", now, |mark| store.is_committed(mark)).unwrap()
    };

    // Committed: the record is written inside the transaction, marked with its event.
    let transaction = store.begin_request_transaction().unwrap();
    assert_eq!(recall("k1"), Recall::Fresh);
    store.create_org(&ctx("req-1"), "acme", "Acme").unwrap();
    let mark = store
        .commit_mark("req-1")
        .unwrap()
        .expect("the request's event");
    assert_eq!(store.commit_mark("req-other").unwrap(), None);
    idempotency::remember(&kv, KEY_ID, "k1", "fp", response("1"), Some(mark), now).unwrap();
    transaction.commit().unwrap();
    assert_eq!(recall("k1"), Recall::Replay(response("1")));
    assert_eq!(
        idempotency::recall(&kv, KEY_ID, "k1", "other", now, |_| Ok(true)).unwrap(),
        Recall::Mismatch
    );

    // The process "dies" after writing the record and before the commit: the transaction is
    // never committed, so the record must not be replayed, and the request runs afresh.
    let transaction = store.begin_request_transaction().unwrap();
    store.create_org(&ctx("req-2"), "globex", "Globex").unwrap();
    let mark = store
        .commit_mark("req-2")
        .unwrap()
        .expect("the request's event");
    idempotency::remember(&kv, KEY_ID, "k2", "fp", response("2"), Some(mark), now).unwrap();
    drop(transaction);
    assert_eq!(org_count(&db), 1, "the uncommitted org is gone");
    assert_eq!(recall("k2"), Recall::Fresh);
    assert_eq!(recall("k2"), Recall::Fresh, "and the stale record with it");

    // A different event later taking the same sequence number does not fool the check.
    store
        .create_org(&ctx("req-3"), "initech", "Initech")
        .unwrap();
    let stale = CommitMark {
        seq: store.commit_mark("req-3").unwrap().unwrap().seq,
        hash: "0".repeat(64),
    };
    assert!(!store.is_committed(&stale).unwrap());
}

#[test]
fn store_writes_join_the_request_transaction_each_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator(KEY_ID);
    let ctx = Context {
        caller: &operator,
        now: from_millis(1_800_000_000_000),
        request_id: "req",
        client_request_id: None,
    };
    let transaction = store.begin_request_transaction().unwrap();
    store.create_org(&ctx, "acme", "Acme").unwrap();
    // A refused write inside the transaction leaves the rest of it intact.
    assert!(store.create_org(&ctx, "acme", "Acme again").is_err());
    store.create_org(&ctx, "globex", "Globex").unwrap();
    assert_eq!(org_count(&db), 2);
    transaction.commit().unwrap();
    assert_eq!(org_count(&db), 2);

    // Outside a request transaction, writes commit on their own again.
    store.create_org(&ctx, "initech", "Initech").unwrap();
    let transaction = store.begin_request_transaction().unwrap();
    store.create_org(&ctx, "hooli", "Hooli").unwrap();
    drop(transaction);
    assert_eq!(
        org_count(&db),
        3,
        "a dropped request transaction writes nothing"
    );
    let events: i64 = db
        .connection()
        .query_row("SELECT count(*) FROM audit_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(events, 3);
}
