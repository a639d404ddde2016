//! Reclaim: one write, answered once under an Idempotency-Key, never outlived by a spot VM, and the
//! double-sell cycle with the market it feeds.

use super::*;

#[test]
fn a_reclaim_is_one_transaction() {
    let world = World::open();
    world.ok(Op::Release, &["g1", "g2"]);
    let audience_vm = placed_vm(&world.audience, NODE, &["g0"], "verified");
    let spot = placed_vm(&world.outsider, NODE, &["g1", "g2"], "spot");
    let spot_beside = placed_vm(&world.outsider, NODE, &["g4"], "spot");

    // With the audit trail refusing writes, the reclaim fails as a whole: the units stay on
    // the market and the spot VM keeps running.
    world
        .app
        .node_db(NODE)
        .execute_batch(
            "CREATE TRIGGER test_audit_offline BEFORE INSERT ON audit_events \
             BEGIN SELECT RAISE(ABORT, 'audit offline'); END",
        )
        .expect("install the failing trigger");
    let before = world.snapshot();
    world
        .call(&world.owner, Op::Reclaim, &["g0", "g1", "g2", "g3"])
        .expect_problem(500, "internal-error");
    world
        .call(&world.owner, Op::Release, &["g3"])
        .expect_problem(500, "internal-error");
    assert_same_state(&before, &world.snapshot(), "nothing half-done");
    assert_eq!(world.vm(&spot)["status"], "running");
    assert_eq!(world.released(), sorted(["g1", "g2"]));
    world
        .app
        .db()
        .execute_batch("DROP TRIGGER test_audit_offline")
        .expect("remove the failing trigger");

    // Once it can, it does all of it at once, with one audit event.
    let events = world.audit_count();
    let reclaimed = world
        .manager
        .post(
            &format!("{}/reclaim", world.path()),
            &json!({ "unitIds": ["g0", "g1", "g2", "g3"], "reason": "owner needs them back" }),
        )
        .expect_status(200)
        .json();
    assert_eq!(reclaimed["terminated"], json!([spot]));
    assert_eq!(reclaimed["skipped"], json!([audience_vm]));
    assert_eq!(reclaimed["releasedUnitIds"], json!([]));
    assert_eq!(world.audit_count(), events + 1);
    let (action, actor_org, units, terminated, skipped, reason) = world.last_event();
    assert_eq!(action, "reservation.reclaim");
    assert_eq!(actor_org.as_deref(), Some(MANAGER));
    assert_eq!(units, json!(["g0", "g1", "g2", "g3"]));
    assert_eq!(terminated, json!([spot]));
    assert_eq!(skipped, json!([audience_vm]));
    assert_eq!(reason.as_deref(), Some("owner needs them back"));

    let stopped = world.vm(&spot);
    assert_eq!(stopped["status"], "terminated");
    assert_eq!(stopped["terminationReason"], "reclaimed");
    assert!(stopped["terminatedAt"].is_string());
    assert_eq!(world.vm(&audience_vm)["status"], "running");
    assert_eq!(world.vm(&spot_beside)["status"], "running");
}

#[test]
fn a_retried_reclaim_with_the_same_idempotency_key_is_answered_from_the_record() {
    let world = World::open();
    world.ok(Op::Release, &["g1"]);
    let spot = placed_vm(&world.outsider, NODE, &["g1"], "spot");
    let keyed = world.owner.with_header("idempotency-key", "reclaim-1");
    let first = world.call(&keyed, Op::Reclaim, &["g1"]).expect_status(200);
    let events = world.audit_count();
    let retry = world.call(&keyed, Op::Reclaim, &["g1"]).expect_status(200);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.json(), first.json());
    assert_eq!(retry.json()["terminated"], json!([spot]));
    assert_eq!(world.audit_count(), events, "the retry wrote nothing");
    world
        .call(&keyed, Op::Reclaim, &["g2"])
        .expect_problem(422, "idempotency-key-reused");
}

/// A spot VM bought before the term started sits on a unit that was never released; the
/// reclaim takes it back when the term starts.
#[test]
fn a_spot_vm_bought_before_the_term_is_reclaimed_once_it_starts() {
    let world = World::open();
    let app = &world.app;
    let future = app.make_reservation(
        &ReservationSpec::on(NODE, &["g4", "g5"])
            .audience(&[AUDIENCE])
            .starts_in(3600),
    );
    let path = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        future["id"].as_str().unwrap()
    );
    let early_spot = placed_vm(&world.outsider, NODE, &["g4", "g6"], "spot");
    app.set_clock_offset_secs(2 * 3600);

    let dry_run = world
        .owner
        .post(
            &format!("{path}/reclaim/dry-run"),
            &json!({ "unitIds": ["g4", "g5"] }),
        )
        .expect_status(200)
        .json();
    assert_eq!(dry_run["status"], "active");
    assert_eq!(dry_run["wouldTerminate"], json!([early_spot]));
    let reclaimed = world
        .owner
        .post(
            &format!("{path}/reclaim"),
            &json!({ "unitIds": ["g4", "g5"] }),
        )
        .expect_status(200)
        .json();
    assert_eq!(reclaimed["terminated"], dry_run["wouldTerminate"]);
    assert_eq!(reclaimed["skipped"], json!([]));
    assert_eq!(reclaimed["releasedUnitIds"], json!([]));
    assert_eq!(world.vm(&early_spot)["terminationReason"], "reclaimed");
    // The whole VM stopped, so its unit outside the reservation is free too.
    placed_vm(&world.outsider, NODE, &["g6"], "community");
    placed_vm(&world.audience, NODE, &["g4", "g5"], "community");
}

/// An outsider's spot placement racing a reclaim of the same unit either lands first and is
/// terminated by the reclaim, or comes second and is refused: after the reclaim, the unit is
/// never left running an outsider's VM.
#[test]
fn a_spot_placement_racing_a_reclaim_never_survives_it() {
    let world = World::open();
    let reclaim_path = format!("{}/reclaim", world.path());
    let (owner, outsider) = (world.owner.clone(), world.outsider.clone());
    for unit in ["g1", "g2", "g3"] {
        world.ok(Op::Release, &[unit]);
        let (reclaim, placement) = at_once(
            || owner.post(&reclaim_path, &json!({ "unitIds": [unit] })),
            || place_vm(&outsider, NODE, &[unit], "spot"),
        );
        let reclaimed = reclaim.expect_status(200).json();
        match placement.status {
            201 => {
                let vm = placement.json()["id"].as_str().unwrap().to_owned();
                assert_eq!(
                    reclaimed["terminated"],
                    json!([vm]),
                    "placed first, reclaimed"
                );
                assert_eq!(world.vm(&vm)["terminationReason"], "reclaimed");
            }
            409 => {
                let problem = placement.expect_problem(409, "placement-refused");
                assert_eq!(
                    problem["refusals"],
                    json!([{ "unitId": unit, "reason": "unavailable" }])
                );
                assert_eq!(reclaimed["terminated"], json!([]));
            }
            other => panic!(
                "placement on {unit} racing a reclaim: {other} {}",
                placement.text()
            ),
        }
        let running_on_unit: i64 = world
            .app
            .db()
            .query_row(
                "SELECT count(*) FROM vm_units WHERE unit_id = ?1 AND running = 1",
                [unit],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(running_on_unit, 0);
    }
}

/// The double-sell cycle: release → a spot VM placed → dry run → reclaim → the spot VM terminated,
/// the non-spot VM skipped → the units usable by the audience again.
#[test]
fn the_full_double_sell_cycle() {
    let world = World::open();
    let audience_vm = placed_vm(&world.audience, NODE, &["g0"], "community");

    let released = world.ok(Op::Release, &["g1", "g2", "g3"]);
    assert_eq!(released["releasedUnitIds"], json!(["g1", "g2", "g3"]));
    let refused = place_vm(&world.audience, NODE, &["g1"], "community")
        .expect_problem(409, "placement-refused");
    assert_eq!(
        refused["refusals"],
        json!([{ "unitId": "g1", "reason": "released-spot-only" }])
    );
    let spot = placed_vm(&world.outsider, NODE, &["g1", "g2"], "spot");

    let dry_run = world.ok(Op::DryRun, &["g0", "g1", "g2", "g3"]);
    assert_eq!(dry_run["wouldTerminate"], json!([spot]));
    assert_eq!(dry_run["wouldSkip"], json!([audience_vm]));
    assert_eq!(dry_run["releasedUnitIds"], json!(["g1", "g2", "g3"]));
    assert_eq!(world.vm(&spot)["status"], "running");

    let reclaimed = world.ok(Op::Reclaim, &["g0", "g1", "g2", "g3"]);
    assert_eq!(reclaimed["terminated"], dry_run["wouldTerminate"]);
    assert_eq!(reclaimed["skipped"], dry_run["wouldSkip"]);
    assert_eq!(reclaimed["releasedUnitIds"], json!([]));
    assert_eq!(world.vm(&spot)["status"], "terminated");
    assert_eq!(world.vm(&spot)["terminationReason"], "reclaimed");
    assert_eq!(world.vm(&audience_vm)["status"], "running");

    // The units are the audience's again, at any tier, and nobody else's (an outsider is not
    // told why: the reservation is none of its business).
    let refused =
        place_vm(&world.outsider, NODE, &["g1"], "spot").expect_problem(409, "placement-refused");
    assert_eq!(
        refused["refusals"],
        json!([{ "unitId": "g1", "reason": "unavailable" }])
    );
    placed_vm(&world.audience, NODE, &["g1", "g2"], "verified");
    placed_vm(&world.audience, NODE, &["g3"], "community");
}

fn same_instant(a: &Value, b: &str) -> bool {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    a.as_str().and_then(parse).is_some() && a.as_str().and_then(parse) == parse(b)
}

#[test]
fn a_reaffirmed_reservation_keeps_the_end_of_its_timed_release() {
    let app = App::start();
    for org in [OWNER, AUDIENCE, OUTSIDER] {
        app.org(org);
    }
    app.node(NODE, OWNER, &RESERVED);
    let reservation = app.reservation(NODE, &["g0", "g1"], &[AUDIENCE], &[]);
    let path = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        reservation["id"].as_str().expect("id")
    );
    let owner = app.key(OWNER, "capacity-manager", None);
    let until = rfc3339_from_now(3600);
    owner
        .post(
            &format!("{path}/release"),
            &json!({ "unitIds": ["g0"], "until": until }),
        )
        .expect_status(200);
    // A change of the node's units withholds the reservation for review; an operator
    // re-affirms it.
    app.operator()
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": OWNER, "unitIds": ["g0", "g1", "g2", "g3", "g4"] }),
        )
        .expect_status(200);
    assert_eq!(
        owner.get(&path).expect_status(200).json()["status"],
        "needs-review"
    );
    app.operator()
        .post(
            &format!("{path}/reaffirm"),
            &json!({ "reason": "units checked" }),
        )
        .expect_status(200);
    let reaffirmed = owner.get(&path).expect_status(200).json();
    assert_eq!(strings(&reaffirmed["releasedUnitIds"]), vec!["g0"]);
    assert!(
        same_instant(&reaffirmed["releasedUntil"]["g0"], &until),
        "the release lost its end: {reaffirmed}"
    );
    // The market offers the unit until then, and a spot VM placed there is told so.
    let buyer = app.key(OUTSIDER, "member", None);
    let market = buyer
        .get(&format!("/v1/market?nodeId={NODE}"))
        .expect_status(200)
        .json();
    assert_eq!(market["items"][0]["unitId"], "g0", "{market}");
    assert!(
        same_instant(&market["items"][0]["endsAt"], &until),
        "{market}"
    );
    let vm = place_vm(&buyer, NODE, &["g0"], "spot")
        .expect_status(201)
        .json();
    assert!(
        same_instant(&vm["interruption"]["terminatesAt"], &until),
        "{vm}"
    );
}

fn units_on_market(app: &App) -> i64 {
    app.db()
        .query_row(
            "SELECT COUNT(*) FROM reservation_units WHERE on_market = 1",
            [],
            |r| r.get(0),
        )
        .expect("count")
}

#[test]
fn units_leave_the_market_s_index_when_their_reservation_is_cancelled_or_ends() {
    let app = App::start();
    for org in [OWNER, AUDIENCE] {
        app.org(org);
    }
    app.node(NODE, OWNER, &UNITS);
    let owner = app.key(OWNER, "capacity-manager", None);
    let cancelled = app.reservation(NODE, &RESERVED, &[AUDIENCE], &[]);
    let cancelled = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        cancelled["id"].as_str().expect("id")
    );
    let ending = app
        .operator()
        .post(
            &format!("/v1/nodes/{NODE}/reservations"),
            &json!({
                "reservedUnitIds": ["g4", "g5"],
                "allowedOrgIds": [AUDIENCE],
                "startsAt": rfc3339_from_now(-60),
                "endsAt": rfc3339_from_now(600),
            }),
        )
        .expect_status(201)
        .json();
    let ending = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        ending["id"].as_str().expect("id")
    );
    for (path, units) in [
        (&cancelled, json!(["g0", "g1", "g2"])),
        (&ending, json!(["g4"])),
    ] {
        owner
            .post(&format!("{path}/release"), &json!({ "unitIds": units }))
            .expect_status(200);
    }
    assert_eq!(units_on_market(&app), 4);
    app.operator()
        .post(&format!("{cancelled}/cancel"), &json!({}))
        .expect_status(200);
    assert_eq!(units_on_market(&app), 1, "a cancel takes its units off");
    // The record still says what was released.
    assert_eq!(
        strings(&app.operator().get(&cancelled).expect_status(200).json()["releasedUnitIds"]),
        vec!["g0", "g1", "g2"]
    );
    // Past the other reservation's end, the next write in its database (about anything:
    // here another node of the same cell) sweeps its unit off.
    app.set_clock_offset_secs(1200);
    assert_eq!(units_on_market(&app), 1);
    app.node(&app.node_id_beside(NODE), OWNER, &["x0"]);
    assert_eq!(
        units_on_market(&app),
        0,
        "an ended term's units stay on the index"
    );
    let market = owner.get("/v1/market").expect_status(200).json();
    assert_eq!(market["items"], json!([]));
}

#[test]
fn the_node_listing_says_how_many_units_are_for_sale_as_the_node_does() {
    let app = App::start();
    for org in [OWNER, AUDIENCE] {
        app.org(org);
    }
    app.node(NODE, OWNER, &UNITS);
    app.node("n2", OWNER, &["h0"]);
    let reservation = app.reservation(NODE, &RESERVED, &[AUDIENCE], &[]);
    let owner = app.key(OWNER, "capacity-manager", None);
    owner
        .post(
            &format!(
                "/v1/nodes/{NODE}/reservations/{}/release",
                reservation["id"].as_str().expect("id")
            ),
            &json!({ "unitIds": ["g0", "g1"] }),
        )
        .expect_status(200);
    let listed = owner.get("/v1/nodes").expect_status(200).json();
    let counts: Vec<(String, Value)> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().expect("id").to_owned(),
                n["releasedIdleUnitCount"].clone(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![(NODE.to_owned(), json!(2)), ("n2".to_owned(), json!(0))]
    );
    assert_eq!(
        owner
            .get(&format!("/v1/nodes/{NODE}"))
            .expect_status(200)
            .json()["releasedIdleUnitCount"],
        2
    );
}
