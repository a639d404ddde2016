//! The audit chains: they verify, tampering with or without the key is found, and an earlier
//! build's events are sealed.

use super::*;

#[test]
fn the_chain_verifies_and_tampering_is_found() {
    let app = App::start_on_one_database();
    let (owner, tenant, _, _, _) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    // Each chain links event to event, in its own order, from the genesis hash; every event
    // but the newest of its chain was sealed by a later write.
    let mut heads: BTreeMap<String, (i64, String, Option<String>)> = BTreeMap::new();
    let mut by_place: BTreeMap<(String, i64), &Value> = BTreeMap::new();
    for event in &everything {
        let chain = event["chain"].as_str().expect("chain").to_owned();
        let (seq, previous, _) =
            heads
                .get(&chain)
                .cloned()
                .unwrap_or((0, GENESIS.to_owned(), None));
        assert_eq!(event["chainSeq"], seq + 1, "the chain's places: {event}");
        assert_eq!(
            event["prevHash"],
            previous.as_str(),
            "the chain links: {event}"
        );
        assert!(
            event["afterSeq"].as_i64().expect("afterSeq") <= seq,
            "an event comes after what its writer saw: {event}"
        );
        by_place.insert((chain.clone(), seq + 1), event);
        let seal = event.get("seal").and_then(Value::as_str).map(str::to_owned);
        heads.insert(
            chain,
            (
                seq + 1,
                event["hash"].as_str().expect("hash").to_owned(),
                seal,
            ),
        );
    }
    assert!(heads.contains_key("platform") && heads.contains_key("node:n1"));
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    let chains: Vec<Value> = heads
        .iter()
        .map(|(chain, (seq, _, newest_seal))| {
            assert_eq!(
                newest_seal, &None,
                "the newest event of {chain} is unsealed"
            );
            match seq {
                1 => json!({"chain": chain, "ok": true, "eventsChecked": seq, "unsealed": 1}),
                _ => {
                    let sealed = by_place[&(chain.clone(), seq - 1)];
                    json!({"chain": chain, "ok": true, "eventsChecked": seq, "unsealed": 1,
                           "lastSeq": seq - 1, "lastHash": sealed["seal"]})
                }
            }
        })
        .collect();
    assert_eq!(
        verified,
        json!({"ok": true, "eventsChecked": everything.len(), "chains": chains})
    );
    let one = operator
        .get("/v1/audit/verify?nodeId=n1")
        .expect_status(200)
        .json();
    assert_eq!(one["chains"].as_array().unwrap().len(), 1);
    assert_eq!(one["chains"][0]["chain"], "node:n1");

    // Verifying is for operators only.
    owner
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    tenant
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    app.anonymous()
        .get("/v1/audit/verify")
        .expect_problem(401, "unauthorized");

    // A changed reason breaks the release's chain at that event.
    let (release_seq, release_chain, release_place): (i64, String, i64) = app
        .db()
        .query_row(
            "SELECT seq, chain, chain_seq FROM audit_events WHERE action = 'reservation.release'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    app.db()
        .execute(
            "UPDATE audit_events SET reason = 'nothing to see' WHERE seq = ?1",
            [release_seq],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(broken["ok"], false, "{broken}");
    assert_eq!(
        (
            broken["brokenChain"].clone(),
            broken["firstBrokenSeq"].clone()
        ),
        (json!(release_chain), json!(release_place))
    );
    // Put back, it verifies again.
    app.db()
        .execute(
            "UPDATE audit_events SET reason = NULL WHERE seq = ?1",
            [release_seq],
        )
        .unwrap();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );

    // Another actor, or a deleted event: each is found where it is.
    app.db()
        .execute(
            "UPDATE audit_events SET actor_key_id = 'key-someone-else' \
             WHERE chain = 'platform' AND chain_seq = 2",
            [],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(
        (
            broken["ok"].clone(),
            broken["brokenChain"].clone(),
            broken["firstBrokenSeq"].clone()
        ),
        (json!(false), json!("platform"), json!(2))
    );
    app.db()
        .execute(
            "DELETE FROM audit_events WHERE chain = 'platform' AND chain_seq = 2",
            [],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(broken["ok"], false);
    assert_eq!(broken["firstBrokenSeq"], 2);
    assert!(
        broken["problem"]
            .as_str()
            .unwrap()
            .contains("chain platform"),
        "{broken}"
    );
}

/// Rewrites every event as a forger with the database but not `audit_key` would: into the
/// one old chain, as unkeyed version-1 events (`edit` changes each first), each hash
/// recomputed with plain SHA-256 and linked to the one before.
fn rehash_unkeyed(app: &App, edit: &str) {
    use sha2::{Digest, Sha256};
    let db = app.db();
    db.execute_batch(&format!(
        "{edit}; UPDATE audit_events SET chain = 'trail', chain_seq = seq + 1000000; \
         UPDATE audit_events SET chain_seq = seq, hash_version = 1;"
    ))
    .unwrap();
    let mut statement = db
        .prepare(
            "SELECT seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, \
             vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason, request_id, \
             visible_to FROM audit_events ORDER BY seq",
        )
        .unwrap();
    let rows: Vec<(i64, Value)> = statement
        .query_map([], |row| {
            let text = |i: usize| row.get::<_, Option<String>>(i);
            let list = |i: usize| -> rusqlite::Result<Value> {
                Ok(serde_json::from_str(&row.get::<_, String>(i)?).unwrap())
            };
            Ok((
                row.get(0)?,
                json!([
                    row.get::<_, i64>(0)?,
                    text(1)?,
                    row.get::<_, i64>(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    text(6)?,
                    text(7)?,
                    text(8)?,
                    text(9)?,
                    text(10)?,
                    list(11)?,
                    list(12)?,
                    list(13)?,
                    text(14)?,
                    text(15)?,
                    list(16)?
                ]),
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut prev = GENESIS.to_owned();
    for (seq, content) in rows {
        let hash = hex::encode(Sha256::digest(format!("{prev}\n{content}")));
        db.execute(
            "UPDATE audit_events SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

#[test]
fn a_trail_rehashed_without_the_key_never_verifies() {
    let app = App::start_on_one_database();
    let (owner, _, _, rid, _) = shared_world(&app);
    owner
        .post(
            &format!("/v1/nodes/n1/reservations/{rid}/reclaim"),
            &json!({ "unitIds": ["u0"], "reason": "internal: customer escalation" }),
        )
        .expect_status(200);
    let operator = app.operator();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );
    // The reclaim's reason and what it terminated forged, every event re-hashed unkeyed.
    rehash_unkeyed(
        &app,
        "UPDATE audit_events SET reason = 'routine maintenance', terminated = '[]' \
         WHERE action = 'reservation.reclaim'",
    );
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(
        verified["ok"], false,
        "the forged trail verified: {verified}"
    );
    assert_eq!(
        (
            verified["brokenChain"].clone(),
            verified["firstBrokenSeq"].clone()
        ),
        (json!("trail"), json!(1))
    );
    assert!(
        verified["problem"]
            .as_str()
            .unwrap()
            .contains("which its place does not allow"),
        "{verified}"
    );
}

#[test]
fn an_earlier_builds_events_are_sealed_and_shown_by_need_to_know() {
    // What a build before per-node chains and need to know left: one unkeyed chain, and a
    // reclaim that showed the spot buyer whose VM it terminated all of it.
    let app = App::start_on_database(|path| {
        let db = reservations_store::native::NativeDb::open(path).unwrap();
        reservations_store::native::earlier_build_with_an_unkeyed_reclaim(&db).unwrap();
    });
    let buyer = app.key("buyer", "admin", None);
    let tenant = app.key("tenant", "admin", None);
    let reclaim = |client: &Client| {
        let page = client
            .get("/v1/audit?action=reservation.reclaim")
            .expect_status(200)
            .json();
        let items = page["items"].as_array().unwrap().clone();
        assert_eq!(items.len(), 1, "{page}");
        items[0].clone()
    };
    // The spot buyer sees only that its VM was terminated (the fields the contract allows
    // its view): not the reservation, its reason or its parties, which the earlier build
    // showed it.
    let seen = reclaim(&buyer);
    assert_eq!(seen["view"], "own-vms", "{seen}");
    assert_event_fits_its_view("the spot buyer", &seen);
    assert_eq!(seen["terminated"], json!(["vm-1"]), "{seen}");
    // The reservation's audience sees all of it, as before.
    let seen = reclaim(&tenant);
    assert_eq!(seen["reservationId"], "r1", "{seen}");
    assert_eq!(seen["reason"], "internal: customer escalation", "{seen}");
    // Sealed under the key, the old chain verifies, and says when it was sealed.
    let verified = app
        .operator()
        .get("/v1/audit/verify")
        .expect_status(200)
        .json();
    assert_eq!(verified["ok"], true, "{verified}");
    let trail = verified["chains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|chain| chain["chain"] == "trail")
        .unwrap_or_else(|| panic!("no trail chain: {verified}"));
    assert_eq!(trail["eventsChecked"], 1, "{verified}");
    assert!(trail["sealedAt"].is_string(), "{verified}");
}
