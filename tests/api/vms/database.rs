//! The database itself refuses what the placement rules refuse, whatever the interleaving.

use super::*;

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Tries a write on the app's database in a transaction that is always rolled back; returns
/// SQLite's refusal, if any. The transaction first adds a running VM `forged` of the outsider
/// on `n1`, so that forged `vm_units` rows have a VM to belong to.
fn try_write(app: &App, statement: &str, params: &[&dyn rusqlite::ToSql]) -> Result<(), String> {
    let mut db = app.node_db(NODE);
    let tx = db.transaction().expect("begin");
    tx.execute(
        "INSERT INTO vms (id, org_id, node_id, tier, status, created_at) \
         VALUES ('forged', ?1, ?2, 'community', 'running', ?3)",
        rusqlite::params![OUTSIDER, NODE, now_millis()],
    )
    .expect("a VM row");
    let outcome = tx
        .execute(statement, params)
        .map(|_| ())
        .map_err(|e| e.to_string());
    tx.rollback().expect("rollback");
    outcome
}

const INSERT_VM_UNIT: &str = "INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at) \
     VALUES ('forged', 0, ?1, ?2, ?3, ?4, ?5)";

#[track_caller]
fn assert_refused(outcome: Result<(), String>, needle: &str) {
    match outcome {
        Ok(()) => panic!("the database accepted a write it must refuse ({needle})"),
        Err(message) => assert!(
            message.contains(needle),
            "{message:?} should mention {needle:?}"
        ),
    }
}

#[test]
fn the_database_itself_refuses_what_the_placement_rules_refuse() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g1"]);
    placed_vm(&market.outsider, NODE, &["g5"], "spot");
    placed_vm(&market.audience, NODE, &["g0"], "community");
    // A second node, in the first one's database, whose only reservation is withheld for
    // review.
    let n2 = app.node_id_beside(NODE);
    app.node(&n2, OWNER, &["h0", "h1"]);
    app.reservation(&n2, &["h0"], &[AUDIENCE], &[]);
    app.operator()
        .put(
            &format!("/v1/nodes/{n2}"),
            &json!({ "ownerOrgId": OWNER, "unitIds": ["h0", "h1", "h2"] }),
        )
        .expect_status(200);

    // A unit runs at most one running VM...
    assert_refused(
        try_write(
            app,
            INSERT_VM_UNIT,
            &[&NODE, &"g5", &"spot", &1, &now_millis()],
        ),
        "UNIQUE constraint failed: vm_units.node_id, vm_units.unit_id",
    );
    assert_refused(
        try_write(
            app,
            INSERT_VM_UNIT,
            &[&NODE, &"g0", &"verified", &1, &now_millis()],
        ),
        "UNIQUE constraint failed",
    );
    // ...while terminated rows may pile up.
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&NODE, &"g5", &"spot", &0, &now_millis()],
    )
    .expect("a stopped VM's row is not a running VM");
    // Reviving a stopped VM's row on a busy unit is refused just the same.
    let stopped = placed_vm(&market.outsider, NODE, &["g6"], "spot");
    market
        .outsider
        .delete(&format!("/v1/vms/{stopped}"))
        .expect_status(200);
    placed_vm(&market.audience, NODE, &["g6"], "spot");
    assert_refused(
        try_write(
            app,
            "UPDATE vm_units SET running = 1 WHERE vm_id = ?1",
            &[&stopped],
        ),
        "refused: vm-rows-are-final",
    );
    // So is turning a VM into another tier behind the rules' back.
    assert_refused(
        try_write(
            app,
            "UPDATE vm_units SET tier = 'community' WHERE vm_id = ?1",
            &[&stopped],
        ),
        "refused: vm-rows-are-final",
    );

    // A community or verified VM is never on a released unit; a spot one may be.
    for tier in ["community", "verified"] {
        assert_refused(
            try_write(
                app,
                INSERT_VM_UNIT,
                &[&NODE, &"g1", &tier, &1, &now_millis()],
            ),
            "refused: released-spot-only",
        );
    }
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&NODE, &"g1", &"spot", &1, &now_millis()],
    )
    .expect("a spot VM may sit on a released unit");

    // Nothing is placed on a needs-review reservation's units, at any tier; its node's other
    // units are anyone's.
    for tier in ["spot", "community", "verified"] {
        assert_refused(
            try_write(app, INSERT_VM_UNIT, &[&n2, &"h0", &tier, &1, &now_millis()]),
            "refused: withheld-needs-review",
        );
    }
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&n2, &"h1", &"community", &1, &now_millis()],
    )
    .expect("a unit outside the withheld reservation is free");

    // A unit running a community VM is never released.
    assert_refused(
        try_write(
            app,
            "UPDATE reservation_units SET released = 1 WHERE reservation_id = ?1 AND unit_id = 'g0'",
            &[&market.reservation_id],
        ),
        "refused: units-not-idle",
    );
    // Nor written in already released.
    assert_refused(
        try_write(
            app,
            "INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released) \
             SELECT reservation_id, 999, node_id, unit_id, 1 FROM reservation_units \
             WHERE reservation_id = ?1 AND unit_id = 'g0'",
            &[&market.reservation_id],
        ),
        "refused: units-not-idle",
    );
    // A unit running a spot VM may be.
    placed_vm(&market.audience, NODE, &["g2"], "spot");
    try_write(
        app,
        "UPDATE reservation_units SET released = 1 WHERE reservation_id = ?1 AND unit_id = 'g2'",
        &[&market.reservation_id],
    )
    .expect("a unit running a spot VM is idle enough to release");

    // The API agrees with what the database kept.
    let reservation = market
        .owner
        .get(&market.reservation_path())
        .expect_status(200)
        .json();
    assert_eq!(reservation["releasedUnitIds"], json!(["g1"]));
}

/// Many requests for one unit at once: exactly one VM is placed, every other request is told
/// the unit is busy, whatever the interleaving.
#[test]
fn concurrent_placements_on_one_unit_place_exactly_one_vm() {
    let market = Market::open();
    let callers = [
        &market.outsider,
        &market.audience,
        &market.other_audience,
        &market.outsider,
        &market.audience,
        &market.other_audience,
    ];
    for unit in ["g4", "g5", "g6"] {
        let barrier = Barrier::new(callers.len());
        let replies: Vec<Reply> = std::thread::scope(|scope| {
            let handles: Vec<_> = callers
                .iter()
                .map(|client| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        place_vm(client, NODE, &[unit], "spot")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let (created, losers): (Vec<Reply>, Vec<Reply>) =
            replies.into_iter().partition(|r| r.status == 201);
        assert_eq!(created.len(), 1, "exactly one placement on {unit} wins");
        for reply in losers {
            assert_eq!(refusals(reply), refused(&[(unit, "unit-busy")]));
        }
    }
    assert_eq!(market.running_units().len(), 3);
    assert_eq!(market.vm_count(), 3);
}

/// A release racing a community placement on the same unit: one of them wins, never both.
#[test]
fn a_release_racing_a_community_placement_never_lets_both_win() {
    let market = Market::open();
    let release_path = format!("{}/release", market.reservation_path());
    let (owner, audience) = (market.owner.clone(), market.audience.clone());
    for unit in ["g1", "g2", "g3"] {
        let (release, placement) = at_once(
            || owner.post(&release_path, &json!({ "unitIds": [unit] })),
            || place_vm(&audience, NODE, &[unit], "community"),
        );
        match (release.status, placement.status) {
            (200, 409) => assert_eq!(
                refusals(placement),
                refused(&[(unit, "released-spot-only")])
            ),
            (409, 201) => {
                let problem = release.expect_problem(409, "units-not-idle");
                assert_eq!(problem["unitIds"], json!([unit]));
            }
            other => panic!(
                "release and community placement on {unit} ended {other:?}: {} / {}",
                release.text(),
                placement.text()
            ),
        }
    }
    // Whatever happened, no community VM sits on a released unit.
    let db = market.app.db();
    let violations: i64 = db
        .query_row(
            "SELECT count(*) FROM vm_units v JOIN reservation_units ru \
               ON ru.node_id = v.node_id AND ru.unit_id = v.unit_id \
             WHERE v.running = 1 AND v.tier <> 'spot' AND ru.released = 1",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(violations, 0);
}
