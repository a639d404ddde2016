//! The audit chains, natively over a SQLite file: each node's events and the platform's form
//! chains of their own, keyed with `audit_key`; editing, deleting, reordering or inserting an
//! event without the key breaks its chain, named with the place; pins per chain; and a
//! database written with the one chain of earlier builds is sealed again under the key when
//! it is migrated (an event that did not check out as written, and all after it, are left to
//! fail verification), its oldest events given their audience by need to know, and the
//! sealing recorded under the key with its time.

use hmac::{Hmac, Mac};
use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::audit::{
    AuditEvent, AuditFilter, ChainPin, ChainVerification, GENESIS_HASH, Listed,
};
use reservations_store::native::{NativeDb, earlier_build_with_an_unkeyed_reclaim};
use reservations_store::schema::{migrate, migrate_keyed, migrate_to};
use reservations_store::{Context, Store};
use sha2::{Digest, Sha256};

const KEY: &[u8] = b"the key";

/// Two orgs (the platform chain), and a node each with one update (two node chains).
fn populate(store: &Store<'_>) {
    let operator = Caller::operator("operator");
    let ctx = Context {
        client_request_id: Some("client-1"),
        ..Context::new(&operator, from_millis(1_800_000_000_000), "req-1")
    };
    store.identity().create_org(&ctx, "acme", "Acme").unwrap();
    store.identity().create_org(&ctx, "beta", "Beta").unwrap();
    let units = |n: usize| (0..n).map(|i| format!("gpu-{i}")).collect::<Vec<_>>();
    store
        .capacity()
        .put_node(&ctx, "n1", "acme", &units(4))
        .unwrap();
    store
        .capacity()
        .put_node(&ctx, "n2", "beta", &units(2))
        .unwrap();
    store
        .capacity()
        .put_node(&ctx, "n1", "acme", &units(6))
        .unwrap();
}

fn fresh_db() -> (tempfile::TempDir, NativeDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    migrate(&db).unwrap();
    (dir, db)
}

fn verify(db: &NativeDb, key: &[u8], pins: &[ChainPin]) -> ChainVerification {
    Store::keyed(db, key)
        .unwrap()
        .trail()
        .verify_audit_chains(None, pins)
        .unwrap()
}

fn broken_at(verification: &ChainVerification) -> (Option<&str>, Option<i64>) {
    (
        verification.broken_chain.as_deref(),
        verification.first_broken_seq,
    )
}

#[test]
fn each_node_and_the_platform_have_a_chain_keyed_with_the_audit_key() {
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    let verified = verify(&db, KEY, &[]);
    assert!(verified.ok, "{verified:?}");
    assert_eq!(verified.events_checked, 5);
    // Each write sealed the events of its chain before it: the newest of each is unsealed.
    let chains: Vec<(&str, i64, Option<i64>, i64)> = verified
        .chains
        .iter()
        .map(|c| (c.chain.as_str(), c.events_checked, c.last_seq, c.unsealed))
        .collect();
    assert_eq!(
        chains,
        [
            ("node:n1", 2, Some(1), 1),
            ("node:n2", 1, None, 1),
            ("platform", 2, Some(1), 1)
        ]
    );
    let other_key = verify(&db, b"another key", &[]);
    assert!(!other_key.ok);
    assert_eq!(broken_at(&other_key), (Some("node:n1"), Some(1)));
    let one = Store::keyed(&db, KEY)
        .unwrap()
        .trail()
        .verify_audit_chains(Some("node:n2"), &[])
        .unwrap();
    assert!(one.ok);
    assert_eq!(one.chains.len(), 1);
    assert_eq!(one.events_checked, 1);
}

#[test]
fn editing_an_event_without_the_key_breaks_its_chain_there() {
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    db.connection()
        .execute(
            "UPDATE audit_events SET reason = 'routine maintenance' \
             WHERE chain = 'node:n1' AND chain_seq = 2",
            [],
        )
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("node:n1"), Some(2)));
    assert!(
        verified
            .problem
            .as_deref()
            .unwrap()
            .contains("does not match its hash"),
        "{verified:?}"
    );
}

#[test]
fn rehashing_an_edit_without_the_key_is_caught_as_the_key_is_not_known() {
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    // Whoever rewrites an event and relinks it with a hash they can compute (unkeyed, or
    // keyed with a key of their own) changes nothing: the verifier uses the app's key.
    let connection = db.connection();
    let relinked = hex::encode(Sha256::digest(b"forged"));
    connection
        .execute(
            "UPDATE audit_events SET hash_version = 1, hash = ?1 \
             WHERE chain = 'node:n1' AND chain_seq = 1",
            [&relinked],
        )
        .unwrap();
    connection
        .execute(
            "UPDATE audit_events SET prev_hash = ?1 WHERE chain = 'node:n1' AND chain_seq = 2",
            [&relinked],
        )
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("node:n1"), Some(1)));
    assert!(
        verified
            .problem
            .as_deref()
            .unwrap()
            .contains("which its place does not allow"),
        "{verified:?}"
    );
}

#[test]
fn deleting_reordering_or_inserting_breaks_the_chain_naming_the_place() {
    // Deleting the first event of a chain.
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    db.connection()
        .execute(
            "DELETE FROM audit_events WHERE chain = 'platform' AND chain_seq = 1",
            [],
        )
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("platform"), Some(1)));
    assert!(verified.problem.unwrap().contains("event 1 is missing"));

    // Reordering two events of a chain in the trail (their chain places kept).
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    let connection = db.connection();
    let seqs: Vec<i64> = connection
        .prepare("SELECT seq FROM audit_events WHERE chain = 'platform' ORDER BY chain_seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    connection
        .execute_batch(&format!(
            "UPDATE audit_events SET seq = -1 WHERE seq = {a}; \
             UPDATE audit_events SET seq = {a} WHERE seq = {b}; \
             UPDATE audit_events SET seq = {b} WHERE seq = -1;",
            a = seqs[0],
            b = seqs[1]
        ))
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("platform"), Some(2)));
    assert!(verified.problem.unwrap().contains("moved in the trail"));

    // Inserting an event between two of a chain: it takes a place and every later one moves.
    let (_dir, db) = fresh_db();
    populate(&Store::keyed(&db, KEY).unwrap());
    let connection = db.connection();
    connection
        .execute_batch(
            "UPDATE audit_events SET chain_seq = chain_seq + 10 WHERE chain = 'node:n1'; \
             UPDATE audit_events SET chain_seq = chain_seq - 9 WHERE chain = 'node:n1' AND chain_seq = 12; \
             INSERT INTO audit_events (id, at, actor_key_id, action, node_id, unit_ids, terminated, \
               skipped, request_id, visible_to, prev_hash, hash, hash_version, chain, chain_seq) \
             SELECT 'evt-forged', at, actor_key_id, 'node.update', node_id, '[]', '[]', '[]', \
               'req-forged', '[]', hash, 'x', 4, chain, 2 \
             FROM audit_events WHERE chain = 'node:n1' AND chain_seq = 11; \
             UPDATE audit_events SET chain_seq = 1 WHERE chain = 'node:n1' AND chain_seq = 11;",
        )
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("node:n1"), Some(2)));
}

#[test]
fn a_pin_per_chain_catches_the_deletion_of_its_newest_events() {
    let (_dir, db) = fresh_db();
    let store = Store::keyed(&db, KEY).unwrap();
    populate(&store);
    // One more write on each node's chain seals the event before it.
    let operator = Caller::operator("operator");
    let ctx = Context::new(&operator, from_millis(1_800_000_000_001), "req-2");
    let units: Vec<String> = (0..3).map(|i| format!("gpu-{i}")).collect();
    store
        .capacity()
        .put_node(&ctx, "n1", "acme", &units)
        .unwrap();
    store
        .capacity()
        .put_node(&ctx, "n2", "beta", &units)
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    let pins: Vec<ChainPin> = verified
        .chains
        .iter()
        .map(|c| ChainPin {
            chain: c.chain.clone(),
            seq: c.last_seq.unwrap(),
            hash: c.last_hash.clone().unwrap(),
        })
        .collect();
    assert!(verify(&db, KEY, &pins).ok);
    db.connection()
        .execute(
            "DELETE FROM audit_events WHERE chain = 'node:n1' AND chain_seq >= 2",
            [],
        )
        .unwrap();
    // Without the pins, a chain cut at its end still verifies; with them, it does not.
    assert!(verify(&db, KEY, &[]).ok);
    let pinned = verify(&db, KEY, &pins);
    assert_eq!(broken_at(&pinned), (Some("node:n1"), Some(2)));
    assert!(pinned.problem.unwrap().contains("no longer in the chain"));
    // A whole chain deleted, its pin still names it.
    db.connection()
        .execute("DELETE FROM audit_events WHERE chain = 'node:n2'", [])
        .unwrap();
    let pins: Vec<ChainPin> = pins.into_iter().filter(|p| p.chain == "node:n2").collect();
    assert_eq!(
        broken_at(&verify(&db, KEY, &pins)),
        (Some("node:n2"), Some(1))
    );
}

/// An event as a build with one chain wrote it (schema 8): its place in the whole trail in
/// its content, keyed (version 2) or not (version 1).
fn legacy_event(seq: i64, prev_hash: &str, version: i64) -> (String, String) {
    let id = format!("evt-{seq:010}");
    let mut content = serde_json::json!([
        seq,
        id,
        1_700_000_000_000i64 + seq,
        "operator",
        null,
        "org.create",
        null,
        null,
        null,
        format!("org-{seq}"),
        null,
        [],
        [],
        [],
        null,
        format!("req-{seq}"),
    ]);
    let fields = content.as_array_mut().unwrap();
    if version == 1 {
        fields.push(serde_json::json!([format!("org-{seq}")]));
    } else {
        fields.extend([
            serde_json::json!(null),
            serde_json::json!([format!("org-{seq}")]),
            serde_json::json!([]),
        ]);
    }
    (id, written_hash(version, prev_hash, &content))
}

/// A schema-8 database whose trail holds events of the given versions, in order.
fn legacy_db(versions: &[i64]) -> (tempfile::TempDir, NativeDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    migrate_to(&db, 8).unwrap();
    let mut prev = GENESIS_HASH.to_owned();
    for (i, version) in versions.iter().enumerate() {
        let seq = i as i64 + 1;
        let (id, hash) = legacy_event(seq, &prev, *version);
        db.connection()
            .execute(
                "INSERT INTO audit_events (seq, id, at, actor_key_id, action, org_id, unit_ids, \
                 terminated, skipped, request_id, visible_to, vm_owners, hash_version, prev_hash, hash) \
                 VALUES (?1, ?2, ?3, 'operator', 'org.create', ?4, '[]', '[]', '[]', ?5, ?6, '[]', ?7, ?8, ?9)",
                rusqlite::params![
                    seq,
                    id,
                    1_700_000_000_000i64 + seq,
                    format!("org-{seq}"),
                    format!("req-{seq}"),
                    format!("[\"org-{seq}\"]"),
                    version,
                    prev,
                    hash
                ],
            )
            .unwrap();
        prev = hash;
    }
    (dir, db)
}

fn hash_versions(db: &NativeDb) -> Vec<i64> {
    db.connection()
        .prepare("SELECT hash_version FROM audit_events WHERE chain = 'trail' ORDER BY chain_seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_single_chain_database_is_sealed_under_the_key_and_verifies_beside_the_new_chains() {
    let (_dir, db) = legacy_db(&[1, 1, 2, 2]);
    let store = Store::keyed(&db, KEY).unwrap();
    migrate_keyed(&db, KEY).unwrap();
    assert_eq!(
        hash_versions(&db),
        [4, 4, 4, 4],
        "the trail is sealed as version 4"
    );
    populate(&store);
    let verified = verify(&db, KEY, &[]);
    assert!(verified.ok, "{verified:?}");
    let trail = verified.chains.iter().find(|c| c.chain == "trail").unwrap();
    assert_eq!((trail.events_checked, trail.last_seq), (4, Some(4)));
    assert!(trail.sealed_at.is_some(), "the sealing is recorded");
    assert_eq!(verified.events_checked, 9);
    // New events come after the old ones in the trail's order.
    let first_new: i64 = db
        .connection()
        .query_row(
            "SELECT MIN(seq) FROM audit_events WHERE chain <> 'trail'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(first_new, 5);
    // Sealed, the old events need the key like any other: rehashed unkeyed, they fail.
    db.connection()
        .execute(
            "UPDATE audit_events SET hash_version = 1 WHERE chain = 'trail' AND chain_seq = 1",
            [],
        )
        .unwrap();
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("trail"), Some(1)));
}

#[test]
fn an_event_that_does_not_check_out_as_written_is_not_sealed_nor_anything_after_it() {
    // What a forger with the database but not the key would have written: a keyed event
    // rewritten as an unkeyed one, and every later one re-hashed unkeyed.
    let (_dir, db) = legacy_db(&[1, 2, 1, 1]);
    migrate_keyed(&db, KEY).unwrap();
    assert_eq!(hash_versions(&db), [4, 4, 1, 1]);
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("trail"), Some(3)));
    assert!(
        verified.problem.unwrap().contains("event 3"),
        "the forged tail was accepted"
    );
    // A trail all unkeyed cannot be told from one written that way: it is sealed as it is,
    // and needs the key from then on.
    let (_dir, db) = legacy_db(&[1, 1, 1]);
    migrate_keyed(&db, KEY).unwrap();
    assert!(verify(&db, KEY, &[]).ok);
    assert!(!verify(&db, b"another key", &[]).ok);
}

#[test]
fn a_sealing_is_recorded_under_the_key_with_its_time_and_the_trail_is_held_to_it() {
    let seconds = || chrono::Utc::now().timestamp();
    let (_dir, db) = legacy_db(&[1, 1, 2]);
    let before = seconds();
    migrate_keyed(&db, KEY).unwrap();
    let after = seconds();
    let verified = verify(&db, KEY, &[]);
    assert!(verified.ok, "{verified:?}");
    let trail = verified.chains.iter().find(|c| c.chain == "trail").unwrap();
    // When it was sealed is what tells a trail sealed at the upgrade from one put back
    // unkeyed and sealed again later.
    let sealed_at = chrono::DateTime::parse_from_rfc3339(trail.sealed_at.as_deref().unwrap())
        .unwrap()
        .timestamp();
    assert!((before..=after).contains(&sealed_at), "{sealed_at}");
    let sql = |statement: &str| db.connection().execute_batch(statement).unwrap();
    let record: (i64, String) = db
        .connection()
        .query_row("SELECT sealed_at, mac FROM audit_seals", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();

    // Dated again without the key, the record no longer checks out.
    sql("UPDATE audit_seals SET sealed_at = sealed_at - 86400000");
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("trail"), Some(1)));
    assert!(verified.problem.unwrap().contains("MAC"));
    sql(&format!(
        "UPDATE audit_seals SET sealed_at = {}, mac = '{}'",
        record.0, record.1
    ));
    assert!(verify(&db, KEY, &[]).ok);

    // Its newest event deleted, the trail ends before where it was sealed: caught without a pin.
    sql(
        "CREATE TABLE kept AS SELECT * FROM audit_events WHERE chain = 'trail' AND chain_seq = 3; \
         DELETE FROM audit_events WHERE chain = 'trail' AND chain_seq = 3",
    );
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("trail"), Some(3)));
    sql("INSERT INTO audit_events SELECT * FROM kept; DROP TABLE kept");
    assert!(verify(&db, KEY, &[]).ok);

    // The record deleted, a trail is refused until it has one.
    sql("DELETE FROM audit_seals");
    let verified = verify(&db, KEY, &[]);
    assert_eq!(broken_at(&verified), (Some("trail"), Some(1)));
    assert!(verified.problem.unwrap().contains("no seal record"));
}

/// A hash of an earlier build: `prev + "\n" + content`, unkeyed (1) or keyed (2, 3).
fn written_hash(version: i64, prev_hash: &str, content: &serde_json::Value) -> String {
    let input = format!("{prev_hash}\n{content}");
    if version == 1 {
        hex::encode(Sha256::digest(input))
    } else {
        let mut mac = Hmac::<Sha256>::new_from_slice(KEY).unwrap();
        mac.update(input.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

#[test]
fn the_oldest_events_get_their_audience_by_need_to_know_when_sealed() {
    // A schema-8 database with a reclaim written before need to know: the spot buyer whose
    // VM it terminated was listed among those who see all of it.
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    earlier_build_with_an_unkeyed_reclaim(&db).unwrap();
    migrate_keyed(&db, KEY).unwrap();
    let (visible_to, vm_owners): (String, String) = db
        .connection()
        .query_row(
            "SELECT visible_to, vm_owners FROM audit_events WHERE seq = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(visible_to, r#"["owner","tenant"]"#);
    assert_eq!(
        vm_owners,
        r#"[{"orgId":"buyer","vmIds":["vm-1"],"unitIds":["u0"]}]"#
    );
    let seen: Vec<(String, i64)> = db
        .connection()
        .prepare("SELECT org_id, full_view FROM audit_visibility ORDER BY org_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        seen,
        [
            ("buyer".into(), 0),
            ("owner".into(), 1),
            ("tenant".into(), 1)
        ]
    );
    assert!(verify(&db, KEY, &[]).ok);
}

/// Every event of `filter`, a page of `limit` at a time, with the number of pages.
fn listed(store: &Store<'_>, filter: &AuditFilter, limit: usize) -> (Vec<AuditEvent>, usize) {
    let mut events = Vec::new();
    let mut after_seq = None;
    for pages in 1.. {
        let page = store
            .trail()
            .list_audit(&AuditFilter {
                after_seq,
                limit,
                ..filter.clone()
            })
            .unwrap();
        events.extend(page.items.into_iter().map(|listed| match listed {
            Listed::Event(event) => *event,
            Listed::Unreadable { seq, .. } => panic!("event {seq} unreadable"),
        }));
        match page.next_cursor {
            Some(cursor) => after_seq = Some(cursor.parse().unwrap()),
            None => return (events, pages),
        }
    }
    unreachable!()
}

fn ids<'a>(events: impl IntoIterator<Item = &'a AuditEvent>) -> Vec<&'a str> {
    events.into_iter().map(|e| e.id.as_str()).collect()
}

#[test]
fn a_node_s_and_a_reservation_s_events_are_listed_from_the_trail_and_the_node_s_chain() {
    // The reclaim of `r1` on `n1` was written before each node had a chain (chain `trail`);
    // the node's updates after, in its own chain, interleaved with another node's.
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    earlier_build_with_an_unkeyed_reclaim(&db).unwrap();
    migrate_keyed(&db, KEY).unwrap();
    let store = Store::keyed(&db, KEY).unwrap();
    let operator = Caller::operator("operator");
    let ctx = Context::new(&operator, from_millis(1_800_000_000_000), "req-2");
    let units = |n: usize| (0..n).map(|i| format!("u{i}")).collect::<Vec<_>>();
    for count in 2..6 {
        store
            .capacity()
            .put_node(&ctx, "n1", "owner", &units(count))
            .unwrap();
        store
            .capacity()
            .put_node(&ctx, "n2", "buyer", &units(count))
            .unwrap();
    }
    let (all, _) = listed(&store, &AuditFilter::default(), 100);
    let of = |keep: &dyn Fn(&AuditEvent) -> bool| ids(all.iter().filter(|e| keep(e)));
    let on_n1 = of(&|e| e.node_id.as_deref() == Some("n1"));
    assert_eq!((on_n1.len(), on_n1[0]), (5, "evt-1"), "{on_n1:?}");
    let node = |node: &str| AuditFilter {
        node_id: Some(node.into()),
        ..AuditFilter::default()
    };
    let reservation = |id: &str| AuditFilter {
        reservation_id: Some(id.into()),
        ..AuditFilter::default()
    };
    let updates_of_n1 = AuditFilter {
        action: Some("node.update".into()),
        ..node("n1")
    };
    for limit in [1, 2, 3, 10] {
        let (events, pages) = listed(&store, &node("n1"), limit);
        assert_eq!(ids(&events), on_n1, "nodeId=n1, pages of {limit}");
        assert_eq!(pages, on_n1.len().div_ceil(limit), "pages of {limit}");
        assert_eq!(
            ids(&listed(&store, &node("n2"), limit).0),
            of(&|e| e.node_id.as_deref() == Some("n2"))
        );
        assert_eq!(ids(&listed(&store, &reservation("r1"), limit).0), ["evt-1"]);
        assert_eq!(
            ids(&listed(&store, &updates_of_n1, limit).0),
            of(&|e| e.node_id.as_deref() == Some("n1") && e.action == "node.update")
        );
    }
    assert!(listed(&store, &reservation("r-unknown"), 2).0.is_empty());
    assert!(listed(&store, &node("n-unknown"), 2).0.is_empty());
}
