//! `Idempotency-Key` on POST: a retry with the same key and request gets the original
//! status, body and headers (marked `Idempotent-Replayed: true`) and changes nothing; the
//! same key with another request is 422; records are scoped to the calling API key, cover
//! refusals too, expire after 24 hours, and are never made for dry runs.

use serde_json::{Value, json};

use api_support::{App, Client, Reply, ReservationSpec, Scenario};

fn count(app: &App, sql: &str) -> i64 {
    app.db()
        .query_row(sql, [], |row| row.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn audit_events(app: &App) -> i64 {
    count(app, "SELECT COUNT(*) FROM audit_events")
}

fn replayed(reply: &Reply) -> bool {
    reply.header("idempotent-replayed") == Some("true")
}

/// `owner` (admin key) owns node `n1` (units u0..u5) with an active reservation of u0..u3,
/// audience and managers `tenant` (member key).
struct World {
    app: App,
    owner: Client,
    tenant: Client,
    reservation: String,
}

fn world() -> World {
    let scene = Scenario::new()
        .orgs(&["owner", "tenant"])
        .key("owner", "owner", "admin")
        .key("tenant", "tenant", "member")
        .node("n1", "owner", &["u0", "u1", "u2", "u3", "u4", "u5"])
        .reservation(
            "r",
            ReservationSpec::on("n1", &["u0", "u1", "u2", "u3"])
                .audience(&["tenant"])
                .managers(&["tenant"]),
        )
        .open();
    World {
        owner: scene.client("owner"),
        tenant: scene.client("tenant"),
        reservation: scene.reservation_path("r"),
        app: scene.app,
    }
}

#[test]
fn a_retry_gets_the_original_response_and_changes_nothing() {
    let World { app, owner, .. } = world();
    let keyed = owner.with_header("idempotency-key", "create-r2");
    let body = json!({
        "reservedUnitIds": ["u4"],
        "allowedOrgIds": ["tenant"],
        "startsAt": "2020-01-01T00:00:00Z",
        "reason": "retry me",
    });
    let reservations = count(&app, "SELECT COUNT(*) FROM reservations");
    let events = audit_events(&app);

    let first = keyed.post("/v1/nodes/n1/reservations", &body);
    assert!(!replayed(&first));
    let first_id = first.header("x-request-id").map(str::to_owned);
    let first_location = first.header("location").map(str::to_owned);
    let first = first.expect_status(201);
    assert_eq!(
        count(&app, "SELECT COUNT(*) FROM reservations"),
        reservations + 1
    );
    assert_eq!(audit_events(&app), events + 1);

    for _ in 0..3 {
        // Even with a request id of its own, the retry is the original response.
        let retry = keyed
            .with_header("x-request-id", "retry-attempt")
            .post("/v1/nodes/n1/reservations", &body);
        assert!(replayed(&retry), "a retry is marked as a replay");
        assert_eq!(retry.status, 201);
        assert_eq!(retry.body, first.body, "byte for byte the original body");
        assert_eq!(retry.header("location").map(str::to_owned), first_location);
        assert_eq!(retry.header("x-request-id").map(str::to_owned), first_id);
        assert_eq!(retry.header("content-type"), Some("application/json"));
    }
    assert_eq!(
        count(&app, "SELECT COUNT(*) FROM reservations"),
        reservations + 1
    );
    assert_eq!(audit_events(&app), events + 1);

    // The same request without the key is a new request.
    owner
        .post("/v1/nodes/n1/reservations", &body)
        .expect_problem(409, "reservation-overlap");
}

#[test]
fn a_replayed_reclaim_terminates_nothing_more() {
    let World {
        app,
        owner,
        tenant,
        reservation,
    } = world();
    owner
        .post(
            &format!("{reservation}/release"),
            &json!({ "unitIds": ["u0", "u1"] }),
        )
        .expect_status(200);
    let vm_a = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u0"], "tier": "spot" }),
        )
        .created_id();
    let reclaim = owner.with_header("idempotency-key", "reclaim-1");
    let body = json!({ "unitIds": ["u0", "u1"], "reason": "peak" });
    let first = reclaim
        .post(&format!("{reservation}/reclaim"), &body)
        .expect_status(200);
    assert_eq!(first.json()["terminated"], json!([vm_a]));
    let events = audit_events(&app);

    // Meanwhile another spot VM lands on a unit the retry names (u1 is no longer released,
    // but the tenant is the audience).
    let vm_b = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .created_id();
    let retry = reclaim.post(&format!("{reservation}/reclaim"), &body);
    assert!(replayed(&retry));
    assert_eq!(retry.body, first.body);
    assert_eq!(audit_events(&app), events + 1, "only the second placement");
    let read = tenant
        .get(&format!("/v1/vms/{vm_b}"))
        .expect_status(200)
        .json();
    assert_eq!(read["status"], "running", "the replay terminated nothing");
}

#[test]
fn the_same_key_with_another_request_is_422() {
    let World {
        app,
        owner,
        reservation,
        ..
    } = world();
    let keyed = owner.with_header("idempotency-key", "k-1");
    let release = format!("{reservation}/release");
    keyed
        .post(&release, &json!({ "unitIds": ["u0"] }))
        .expect_status(200);
    let events = audit_events(&app);
    for (path, body) in [
        (release.clone(), json!({ "unitIds": ["u1"] })),
        (release.clone(), json!({ "unitIds": ["u0"], "reason": "x" })),
        (
            format!("{reservation}/reclaim"),
            json!({ "unitIds": ["u0"] }),
        ),
    ] {
        let reply = keyed.post(&path, &body);
        assert!(!replayed(&reply));
        reply.expect_problem(422, "idempotency-key-reused");
    }
    assert_eq!(audit_events(&app), events, "nothing was carried out");
    let now = owner.get(&reservation).expect_status(200).json();
    assert_eq!(now["releasedUnitIds"], json!(["u0"]));
}

#[test]
fn keys_are_scoped_to_the_calling_api_key() {
    let World {
        app,
        owner,
        reservation,
        ..
    } = world();
    let other_owner_key = app.key("owner", "capacity-manager", None);
    let release = format!("{reservation}/release");
    let events = audit_events(&app);
    let first = owner
        .with_header("idempotency-key", "shared")
        .post(&release, &json!({ "unitIds": ["u0"] }));
    assert!(!replayed(&first));
    first.expect_status(200);
    // The same key and the same request from another API key: carried out, not replayed.
    let second = other_owner_key
        .with_header("idempotency-key", "shared")
        .post(&release, &json!({ "unitIds": ["u0"] }));
    assert!(!replayed(&second));
    second.expect_status(200);
    // And a different request under the same key from a third API key is no conflict.
    app.operator()
        .with_header("idempotency-key", "shared")
        .post(&release, &json!({ "unitIds": ["u1"] }))
        .expect_status(200);
    assert_eq!(audit_events(&app), events + 3);
    let actors: Vec<String> = app
        .db()
        .prepare("SELECT actor_key_id FROM audit_events WHERE action = 'reservation.release' ORDER BY seq")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(actors.len(), 3);
    assert_eq!(actors[2], "operator");
    assert_ne!(actors[0], actors[1]);
}

#[test]
fn refusals_are_replayed_too() {
    let World {
        owner,
        tenant,
        reservation,
        app: _app,
        ..
    } = world();
    // A community VM on u2 keeps it from being released.
    let vm_c = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u2"], "tier": "community" }),
        )
        .created_id();
    let keyed = owner.with_header("idempotency-key", "release-u2");
    let release = format!("{reservation}/release");
    let body = json!({ "unitIds": ["u2"] });
    let refused = keyed.post(&release, &body);
    let refused_body = refused.body.clone();
    let problem = refused.expect_problem(409, "units-not-idle");
    assert_eq!(problem["vmIds"], json!([vm_c]));

    tenant.delete(&format!("/v1/vms/{vm_c}")).expect_status(200);
    // The unit is idle now, but the retry is the original answer...
    let retry = keyed.post(&release, &body);
    assert!(replayed(&retry));
    assert_eq!(retry.body, refused_body);
    let replayed_problem = retry.expect_problem(409, "units-not-idle");
    assert_eq!(replayed_problem, problem);
    let now = owner.get(&reservation).expect_status(200).json();
    assert_eq!(now["releasedUnitIds"], json!([]));
    // ...and a new key carries the request out.
    owner
        .with_header("idempotency-key", "release-u2-again")
        .post(&release, &body)
        .expect_status(200);

    // Malformed requests are answered the same way on a retry.
    let malformed = owner.with_header("idempotency-key", "bad-body");
    malformed
        .post(&release, &json!({ "unitIds": "u3" }))
        .expect_problem(400, "invalid-type");
    let retry = malformed.post(&release, &json!({ "unitIds": "u3" }));
    assert!(replayed(&retry));
    retry.expect_problem(400, "invalid-type");
}

#[test]
fn records_expire_after_24_hours() {
    let World {
        app,
        owner,
        reservation,
        ..
    } = world();
    let keyed = owner.with_header("idempotency-key", "daily");
    let release = format!("{reservation}/release");
    let body = json!({ "unitIds": ["u0"] });
    keyed.post(&release, &body).expect_status(200);
    let events = audit_events(&app);

    app.set_clock_offset_secs(23 * 3600);
    let retry = keyed.post(&release, &body);
    assert!(replayed(&retry), "still remembered after 23 hours");
    retry.expect_status(200);
    keyed
        .post(&release, &json!({ "unitIds": ["u1"] }))
        .expect_problem(422, "idempotency-key-reused");
    assert_eq!(audit_events(&app), events);

    app.set_clock_offset_secs(25 * 3600);
    let later = keyed.post(&release, &body);
    assert!(!replayed(&later), "forgotten after 24 hours");
    later.expect_status(200);
    assert_eq!(audit_events(&app), events + 1, "carried out afresh");
    // The key is now bound to the new request: another body conflicts again.
    keyed
        .post(&release, &json!({ "unitIds": ["u1"] }))
        .expect_problem(422, "idempotency-key-reused");
}

#[test]
fn an_invalid_key_is_400_and_nothing_happens() {
    let World {
        app,
        owner,
        reservation,
        ..
    } = world();
    let release = format!("{reservation}/release");
    let events = audit_events(&app);
    for invalid in ["", "has space", &"k".repeat(256)] {
        owner
            .with_header("idempotency-key", invalid)
            .post(&release, &json!({ "unitIds": ["u0"] }))
            .expect_problem(400, "invalid-idempotency-key");
    }
    assert_eq!(audit_events(&app), events);
    // The longest valid key, and punctuation, are fine.
    for valid in ["k".repeat(255), "order:42/retry#1~x".to_owned()] {
        owner
            .with_header("idempotency-key", &valid)
            .post(&release, &json!({ "unitIds": ["u0"] }))
            .expect_status(200);
    }
}

#[test]
fn dry_runs_are_never_recorded() {
    let World {
        owner,
        tenant,
        reservation,
        app: _app,
        ..
    } = world();
    owner
        .post(
            &format!("{reservation}/release"),
            &json!({ "unitIds": ["u0"] }),
        )
        .expect_status(200);
    let dry_run = format!("{reservation}/reclaim/dry-run");
    let keyed = owner.with_header("idempotency-key", "preview");
    let body = json!({ "unitIds": ["u0"] });
    let before: Value = {
        let reply = keyed.post(&dry_run, &body);
        assert!(!replayed(&reply));
        reply.expect_status(200).json()
    };
    assert_eq!(before["wouldTerminate"], json!([]));

    let vm_s = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u0"], "tier": "spot" }),
        )
        .created_id();
    let after = keyed.post(&dry_run, &body);
    assert!(
        !replayed(&after),
        "a dry run always reflects the current state"
    );
    assert_eq!(
        after.expect_status(200).json()["wouldTerminate"],
        json!([vm_s])
    );
    // Nor does the key bind the dry run's body.
    keyed
        .post(&dry_run, &json!({ "unitIds": ["u0", "u1"] }))
        .expect_status(200);
    // And the dry run's key remains free for a real reclaim.
    let reclaim = keyed.post(&format!("{reservation}/reclaim"), &body);
    assert!(!replayed(&reclaim));
    assert_eq!(
        reclaim.expect_status(200).json()["terminated"],
        json!([vm_s])
    );
}

#[test]
fn a_key_that_may_change_nothing_leaves_no_record() {
    let World {
        app, reservation, ..
    } = world();
    let viewer = app.key("tenant", "viewer", None);
    let before = count(&app, "SELECT COUNT(*) FROM idempotency_records");
    let release = format!("{reservation}/release");
    for attempt in 0..5 {
        let keyed = viewer.with_header("idempotency-key", &format!("viewer-{attempt}"));
        // Without reservation.capacity, the reservation is not there for it.
        keyed
            .post(&release, &json!({ "unitIds": ["u0"] }))
            .expect_problem(404, "not-found");
        keyed
            .post(
                "/v1/vms",
                &json!({ "nodeId": "n1", "unitIds": ["u4"], "tier": "spot" }),
            )
            .expect_problem(403, "forbidden");
    }
    assert_eq!(
        count(&app, "SELECT COUNT(*) FROM idempotency_records"),
        before,
        "refusals for want of permission were recorded"
    );
    // A retry is refused again, the same way, and is not a replay.
    let retry = viewer
        .with_header("idempotency-key", "viewer-0")
        .post(&release, &json!({ "unitIds": ["u0"] }));
    assert!(!replayed(&retry));
    retry.expect_problem(404, "not-found");
}
