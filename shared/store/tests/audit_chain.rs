//! The audit chain's hash versions, natively over a SQLite file: version 2 verifies only with
//! the key it was written with, and events written before the keyed chain (version 1: plain
//! SHA-256 over the same link) keep verifying beside them.

use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::native::NativeDb;
use reservations_store::{Context, Store};
use sha2::{Digest, Sha256};

fn append_two_events(store: &Store<'_>) {
    let operator = Caller::operator("operator");
    let ctx = Context {
        caller: &operator,
        now: from_millis(1_800_000_000_000),
        request_id: "req-1",
        client_request_id: Some("client-1"),
    };
    store.create_org(&ctx, "acme", "Acme").unwrap();
    store.create_org(&ctx, "beta", "Beta").unwrap();
}

#[test]
fn version_2_verifies_only_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    append_two_events(&Store::keyed(&db, b"the key").unwrap());
    let verified = Store::keyed(&db, b"the key")
        .unwrap()
        .verify_audit_chain(None)
        .unwrap();
    assert!(verified.ok, "{verified:?}");
    assert_eq!(verified.last_seq, Some(2));
    let other_key = Store::keyed(&db, b"another key")
        .unwrap()
        .verify_audit_chain(None)
        .unwrap();
    assert!(!other_key.ok);
    assert_eq!(other_key.first_broken_seq, Some(1));
}

#[test]
fn version_1_events_keep_verifying() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    let store = Store::keyed(&db, b"k").unwrap();
    append_two_events(&store);
    // Rewrite the first event as a version-1 event would have been written (its content ends
    // with visibleTo; no client request id, no VM owners), and relink the second to it.
    let connection = db.connection();
    let (id, at, visible_to): (String, i64, String) = connection
        .query_row(
            "SELECT id, at, visible_to FROM audit_events WHERE seq = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let content = serde_json::json!([
        1,
        id,
        at,
        "operator",
        null,
        "org.create",
        null,
        null,
        null,
        "acme",
        null,
        [],
        [],
        [],
        null,
        "req-1",
        serde_json::from_str::<serde_json::Value>(&visible_to).unwrap(),
    ]);
    let genesis = "0".repeat(64);
    let v1_hash = hex::encode(Sha256::digest(format!("{genesis}\n{content}")));
    connection
        .execute(
            "UPDATE audit_events SET hash_version = 1, client_request_id = NULL, hash = ?1 WHERE seq = 1",
            [&v1_hash],
        )
        .unwrap();
    connection
        .execute(
            "UPDATE audit_events SET prev_hash = ?1 WHERE seq = 2",
            [&v1_hash],
        )
        .unwrap();
    // The second event's own hash covers its prev_hash, so it no longer matches: re-verify
    // finds the break exactly there, after the version-1 event passed.
    let verified = store.verify_audit_chain(None).unwrap();
    assert_eq!(verified.first_broken_seq, Some(2), "{verified:?}");
}
