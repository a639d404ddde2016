//! A node's topology changing under its reservations: needs-review, and re-affirming.

use super::*;

/// The topology suite's world: the parties, and reservations of every status on `n1`.
struct Topology {
    app: App,
    operator: Client,
    owner: Client,
    tenant: Client,
    broker: Client,
    stranger: Client,
    /// Active on g0..g1, g1 released.
    active: String,
    cancelled: String,
    expired: String,
    pending: String,
    other_active: String,
}

fn topology() -> Topology {
    let reservation = |units: &[&str], starts_in: i64| {
        ReservationSpec::on(NODE, units)
            .audience(&["tenant"])
            .managers(&["broker"])
            .starts_in(starts_in)
    };
    let scene = Scenario::new()
        .orgs(&["owner", "tenant", "broker", "stranger"])
        .node(NODE, "owner", &UNITS)
        .key("owner", "owner", "capacity-manager")
        .key("tenant", "tenant", "member")
        .key("broker", "broker", "capacity-manager")
        .key("stranger", "stranger", "admin")
        .reservation("active", reservation(&["g0", "g1"], -3600))
        .reservation("cancelled", reservation(&["g2"], -3600))
        .cancel("cancelled")
        .reservation("expired", reservation(&["g3"], -7200).ends_in(-3600))
        .reservation("pending", reservation(&["g3"], 3600).ends_in(7200))
        .reservation("other active", reservation(&["g4"], -3600))
        .release(ReleaseSpec::of("active", &["g1"]))
        .open();
    Topology {
        operator: scene.app.operator(),
        owner: scene.client("owner"),
        tenant: scene.client("tenant"),
        broker: scene.client("broker"),
        stranger: scene.client("stranger"),
        active: scene.reservation_id("active"),
        cancelled: scene.reservation_id("cancelled"),
        expired: scene.reservation_id("expired"),
        pending: scene.reservation_id("pending"),
        other_active: scene.reservation_id("other active"),
        app: scene.app,
    }
}

#[test]
fn a_topology_change_withholds_reservations_until_an_operator_reaffirms_them() {
    let t = topology();
    the_same_units_in_another_order_change_nothing(&t);
    a_new_unit_withholds_every_live_unexpired_reservation(&t);
    needs_review_grants_nothing_and_withholds_its_units(&t);
    only_operators_reaffirm_and_the_status_is_derived_again(&t);
    let moved = reaffirming_with_new_units_checks_them_like_a_new_reservation(&t);
    a_reaffirmed_reservation_is_withheld_again_by_the_next_change(&t, &moved);
}

fn the_same_units_in_another_order_change_nothing(t: &Topology) {
    // The same set in another order changes nothing.
    let mut reordered: Vec<&str> = UNITS.to_vec();
    reordered.reverse();
    let same = t
        .owner
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": reordered }),
        )
        .expect_status(200)
        .json();
    assert_eq!(same["topologyGen"], 1);
    assert_eq!(same["withheldReservationIds"], json!([]));
    assert_eq!(status(&t.operator, &t.active), "active");
}

fn a_new_unit_withholds_every_live_unexpired_reservation(t: &Topology) {
    // A new unit: generation 2, and every live, unexpired reservation is withheld.
    let mut grown: Vec<&str> = UNITS.to_vec();
    grown.push("g8");
    let changed = t
        .owner
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": grown }),
        )
        .expect_status(200)
        .json();
    assert_eq!(changed["topologyGen"], 2);
    assert_eq!(
        strings(&changed["withheldReservationIds"]),
        sorted(vec![
            t.active.clone(),
            t.pending.clone(),
            t.other_active.clone()
        ])
    );
    for id in [&t.active, &t.pending, &t.other_active] {
        assert_eq!(status(&t.operator, id), "needs-review");
    }
    assert_eq!(status(&t.operator, &t.cancelled), "cancelled");
    assert_eq!(status(&t.operator, &t.expired), "expired");
    let withheld = t
        .operator
        .get(&format!("{}?status=needs-review", reservations_path()))
        .expect_status(200)
        .json();
    assert_eq!(
        sorted(ids(&withheld)),
        sorted(vec![
            t.active.clone(),
            t.pending.clone(),
            t.other_active.clone()
        ])
    );
    let read = t
        .tenant
        .get(&reservation_path(&t.active))
        .expect_status(200)
        .json();
    assert_eq!(
        read["topologyGen"], 1,
        "still the generation it was written against"
    );
    assert_eq!(read["releasedUnitIds"], json!(["g1"]));
}

fn needs_review_grants_nothing_and_withholds_its_units(t: &Topology) {
    // Needs-review grants nothing and withholds its units from everyone; a t.stranger, who may
    // not see the reservation, is told only that the unit is not available to it.
    for (who, key, unit, tier, reason) in [
        (
            "audience",
            &t.tenant,
            "g0",
            "community",
            "withheld-needs-review",
        ),
        (
            "audience, spot on a released unit",
            &t.tenant,
            "g1",
            "spot",
            "withheld-needs-review",
        ),
        ("stranger, spot", &t.stranger, "g4", "spot", "unavailable"),
    ] {
        let problem = key
            .post(
                "/v1/vms",
                &json!({ "nodeId": NODE, "unitIds": [unit], "tier": tier }),
            )
            .expect_problem(409, "placement-refused");
        assert_eq!(
            problem["refusals"],
            json!([{ "unitId": unit, "reason": reason }]),
            "{who}"
        );
    }
    for action in ["release", "reclaim"] {
        let problem = t
            .operator
            .post(
                &format!("{}/{action}", reservation_path(&t.active)),
                &json!({ "unitIds": ["g0"] }),
            )
            .expect_problem(409, "reservation-not-active");
        assert_eq!(problem["reservationStatus"], "needs-review", "{action}");
    }
    let problem = create(&t.operator, &request(&["g0"], &rfc3339_from_now(-60), None))
        .expect_problem(409, "reservation-overlap");
    assert_eq!(problem["reservationIds"], json!([t.active]));
}

fn only_operators_reaffirm_and_the_status_is_derived_again(t: &Topology) {
    // Re-affirming is for operators only; those who cannot see it get 404.
    let reaffirm_path = format!("{}/reaffirm", reservation_path(&t.active));
    for (who, key) in [
        ("owner", &t.owner),
        ("audience", &t.tenant),
        ("manager", &t.broker),
    ] {
        let reply = key.post(&reaffirm_path, &json!({}));
        assert_eq!(reply.status, 403, "{who}: {}", reply.text());
        reply.expect_problem(403, "forbidden");
    }
    t.stranger
        .post(&reaffirm_path, &json!({}))
        .expect_problem(404, "not-found");
    assert_eq!(status(&t.operator, &t.active), "needs-review");

    // As it was, against the current topology: the status is derived again.
    let reaffirmed = t
        .operator
        .post(&reaffirm_path, &json!({ "reason": "checked the new unit" }))
        .expect_status(200)
        .json();
    assert_eq!(reaffirmed["status"], "active");
    assert_eq!(reaffirmed["topologyGen"], 2);
    assert_eq!(reaffirmed["reservedUnitIds"], json!(["g0", "g1"]));
    assert_eq!(reaffirmed["releasedUnitIds"], json!(["g1"]));
    assert_eq!(status(&t.tenant, &t.active), "active");
    let problem = t
        .operator
        .post(&reaffirm_path, &json!({}))
        .expect_problem(409, "reservation-not-needs-review");
    assert_eq!(problem["reservationStatus"], "active");
    for (id, shown) in [(&t.cancelled, "cancelled"), (&t.expired, "expired")] {
        let problem = t
            .operator
            .post(&format!("{}/reaffirm", reservation_path(id)), &json!({}))
            .expect_problem(409, "reservation-not-needs-review");
        assert_eq!(problem["reservationStatus"], shown);
    }
    let vm = t
        .tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": NODE, "unitIds": ["g0"], "tier": "community" }),
        )
        .expect_status(201)
        .json();
    assert_eq!(vm["status"], "running");
}

fn reaffirming_with_new_units_checks_them_like_a_new_reservation(t: &Topology) -> String {
    let app = &t.app;
    // With new units: checked like a new reservation, then derived again (still t.pending).
    let pending_path = format!("{}/reaffirm", reservation_path(&t.pending));
    let problem = t
        .operator
        .post(&pending_path, &json!({ "reservedUnitIds": ["g8", "g9"] }))
        .expect_problem(422, "unknown-units");
    assert_eq!(problem["unitIds"], json!(["g9"]));
    let problem = t
        .operator
        .post(&pending_path, &json!({ "reservedUnitIds": ["g8", "g8"] }))
        .expect_problem(422, "duplicate-ids");
    assert_eq!(problem["ids"], json!(["g8"]));
    t.operator
        .post(&pending_path, &json!({ "reservedUnitIds": [] }))
        .expect_problem(422, "invalid-field");
    let problem = t
        .operator
        .post(&pending_path, &json!({ "reservedUnitIds": ["g1", "g8"] }))
        .expect_problem(409, "reservation-overlap");
    assert_eq!(problem["unitIds"], json!(["g1"]));
    assert_eq!(problem["reservationIds"], json!([t.active]));
    t.operator
        .post(&pending_path, &json!({ "unitIds": ["g8"] }))
        .expect_problem(400, "unknown-field");
    assert_eq!(
        status(&t.operator, &t.pending),
        "needs-review",
        "refusals change nothing"
    );
    let moved = t
        .operator
        .post(&pending_path, &json!({ "reservedUnitIds": ["g8"] }))
        .expect_status(200)
        .json();
    assert_eq!(moved["status"], "pending");
    assert_eq!(moved["topologyGen"], 2);
    assert_eq!(moved["reservedUnitIds"], json!(["g8"]));
    // Its old unit is free again for that term.
    created(
        app,
        &["g3"],
        &rfc3339_from_now(3600),
        Some(&rfc3339_from_now(7200)),
    );
    moved["id"].as_str().unwrap().to_owned()
}

fn a_reaffirmed_reservation_is_withheld_again_by_the_next_change(t: &Topology, moved: &str) {
    // A re-affirmed reservation is withheld again by the next change.
    let after = t
        .owner
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": UNITS }),
        )
        .expect_status(200)
        .json();
    assert_eq!(after["topologyGen"], 3);
    assert!(
        strings(&after["withheldReservationIds"]).contains(&t.active),
        "{after}"
    );
    assert_eq!(status(&t.operator, moved), "needs-review");
}

#[test]
fn a_reservation_whose_unit_was_removed_is_reaffirmed_with_the_remaining_units() {
    let app = market();
    let operator = app.operator();
    let id = created(&app, &["g0", "g1", "g2"], &rfc3339_from_now(-3600), None);
    operator
        .post(
            &format!("{}/release", reservation_path(&id)),
            &json!({ "unitIds": ["g1", "g2"] }),
        )
        .expect_status(200);

    let shrunk = operator
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g2", "g3"] }),
        )
        .expect_status(200)
        .json();
    assert_eq!(shrunk["withheldReservationIds"], json!([id]));
    assert_eq!(shrunk["topologyGen"], 2);

    let reaffirm_path = format!("{}/reaffirm", reservation_path(&id));
    let problem = operator
        .send("POST", &reaffirm_path, None, None)
        .expect_problem(422, "unknown-units");
    assert_eq!(problem["unitIds"], json!(["g1"]), "the removed unit");
    let reaffirmed = operator
        .post(&reaffirm_path, &json!({ "reservedUnitIds": ["g0", "g2"] }))
        .expect_status(200)
        .json();
    assert_eq!(reaffirmed["status"], "active");
    assert_eq!(reaffirmed["topologyGen"], 2);
    assert_eq!(reaffirmed["reservedUnitIds"], json!(["g0", "g2"]));
    assert_eq!(
        reaffirmed["releasedUnitIds"],
        json!(["g2"]),
        "a unit still reserved stays released"
    );

    // Re-affirmed after its term ended: derived again, expired.
    let short = created(
        &app,
        &["g3"],
        &rfc3339_from_now(-60),
        Some(&rfc3339_from_now(3600)),
    );
    let other = operator
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g2", "g3", "g4"] }),
        )
        .expect_status(200)
        .json();
    assert_eq!(
        strings(&other["withheldReservationIds"]),
        sorted(vec![id, short.clone()])
    );
    app.set_clock_offset_secs(7200);
    assert_eq!(
        status(&operator, &short),
        "needs-review",
        "stored, not derived"
    );
    let reaffirmed = operator
        .post(
            &format!("{}/reaffirm", reservation_path(&short)),
            &json!({}),
        )
        .expect_status(200)
        .json();
    assert_eq!(reaffirmed["status"], "expired");
    assert_eq!(reaffirmed["topologyGen"], 3);
}
