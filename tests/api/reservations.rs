//! Reservations over HTTP: who may create them, every validation error, the status derived
//! from the (test-controlled) clock, cancel, topology change → needs-review → re-affirm,
//! listing with status filters and cursors, and who may see a reservation at all.

use serde_json::{Value, json};

use api_support::{
    App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, rfc3339_from_now, sorted, strings,
};

const NODE: &str = "n1";
const UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];

/// The app with the node's owner `owner`, the audience `tenant`, the managing org `broker`,
/// an unrelated `stranger`, and node `n1` of `owner` with units g0..g7.
fn market() -> App {
    Scenario::new()
        .orgs(&["owner", "tenant", "broker", "stranger"])
        .node(NODE, "owner", &UNITS)
        .open()
        .app
}

fn reservations_path() -> String {
    format!("/v1/nodes/{NODE}/reservations")
}

fn reservation_path(id: &str) -> String {
    format!("/v1/nodes/{NODE}/reservations/{id}")
}

/// A request body for units of `n1`, for the audience `tenant` managed by `broker`.
fn request(units: &[&str], starts_at: &str, ends_at: Option<&str>) -> Value {
    let mut body = json!({
        "reservedUnitIds": units,
        "allowedOrgIds": ["tenant"],
        "managingOrgIds": ["broker"],
        "startsAt": starts_at,
    });
    if let Some(end) = ends_at {
        body["endsAt"] = json!(end);
    }
    body
}

fn create(client: &Client, body: &Value) -> Reply {
    client.post(&reservations_path(), body)
}

/// Creates a reservation as the operator and returns its id.
fn created(app: &App, units: &[&str], starts_at: &str, ends_at: Option<&str>) -> String {
    let reservation = create(&app.operator(), &request(units, starts_at, ends_at))
        .expect_status(201)
        .json();
    reservation["id"].as_str().expect("id").to_owned()
}

fn id_of(reservation: &Value) -> String {
    reservation["id"].as_str().expect("id").to_owned()
}

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a page: {page}"))
        .iter()
        .map(id_of)
        .collect()
}

/// Every reservation of `n1` the client sees, following the cursor from page to page.
fn list_all(client: &Client, query: &str, limit: usize) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("{}?limit={limit}", reservations_path());
        if !query.is_empty() {
            path.push('&');
            path.push_str(query);
        }
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = client.get(&path).expect_status(200).json();
        pages += 1;
        let batch = page["items"].as_array().expect("items").clone();
        assert!(batch.len() <= limit, "a page holds at most {limit}: {page}");
        items.extend(batch);
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => {
                assert!(pages < 1000, "the cursor never ends");
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    (items, pages)
}

/// The status GET shows, after checking that the list shows the same one.
fn status(client: &Client, id: &str) -> String {
    let single = client.get(&reservation_path(id)).expect_status(200).json();
    let listed = client
        .get(&format!("{}?limit=100", reservations_path()))
        .expect_status(200)
        .json();
    let in_list = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not in the list: {listed}"));
    assert_eq!(
        single, *in_list,
        "GET and the list show the same reservation"
    );
    single["status"].as_str().expect("status").to_owned()
}

fn count_reservations(app: &App) -> i64 {
    app.db()
        .query_row("SELECT COUNT(*) FROM reservations", [], |r| r.get(0))
        .expect("count")
}

// ------------------------------------------------------------------------------- create

#[test]
fn the_operator_creates_a_reservation_with_every_field() {
    let app = market();
    let starts_at = rfc3339_from_now(-3600);
    let ends_at = rfc3339_from_now(86_400);
    let mut body = request(&["g1", "g0"], &starts_at, Some(&ends_at));
    body["contractRef"] = json!("contract-42");
    body["reason"] = json!("quarterly block");
    let reply = create(&app.operator(), &body).expect_status(201);
    let reservation = reply.json();
    let id = id_of(&reservation);
    assert_eq!(
        reply.header("location"),
        Some(reservation_path(&id).as_str())
    );
    assert_eq!(reservation["nodeId"], NODE);
    assert_eq!(reservation["status"], "active");
    assert_eq!(
        reservation["reservedUnitIds"],
        json!(["g1", "g0"]),
        "in request order"
    );
    assert_eq!(reservation["releasedUnitIds"], json!([]));
    assert_eq!(reservation["allowedOrgIds"], json!(["tenant"]));
    assert_eq!(reservation["managingOrgIds"], json!(["broker"]));
    assert_eq!(reservation["contractRef"], "contract-42");
    assert_eq!(reservation["reason"], "quarterly block");
    assert_eq!(reservation["topologyGen"], 1);
    for (field, sent) in [("startsAt", &starts_at), ("endsAt", &ends_at)] {
        let shown = chrono::DateTime::parse_from_rfc3339(reservation[field].as_str().unwrap())
            .expect("RFC 3339");
        assert_eq!(
            shown,
            chrono::DateTime::parse_from_rfc3339(sent).unwrap(),
            "{field}"
        );
    }
    assert!(reservation["createdAt"].is_string() && reservation["updatedAt"].is_string());

    let read = app
        .operator()
        .get(&reservation_path(&id))
        .expect_status(200)
        .json();
    assert_eq!(read, reservation);

    // Open-ended: no endsAt at all; managingOrgIds may be left out.
    let open = create(
        &app.operator(),
        &json!({
            "reservedUnitIds": ["g2"],
            "allowedOrgIds": [],
            "startsAt": rfc3339_from_now(-60),
        }),
    )
    .expect_status(201)
    .json();
    assert!(open.get("endsAt").is_none(), "{open}");
    assert_eq!(open["managingOrgIds"], json!([]));
    assert_eq!(open["status"], "active");
}

#[test]
fn the_node_owner_creates_reservations_and_no_one_else_does() {
    let app = market();
    let body = request(&["g0"], &rfc3339_from_now(-60), None);
    let manager = app.key("owner", "capacity-manager", None);
    let reservation = create(&manager, &body).expect_status(201).json();
    assert_eq!(reservation["status"], "active");
    let admin = app.key("owner", "admin", None);
    create(&admin, &request(&["g1"], &rfc3339_from_now(-60), None)).expect_status(201);

    let viewer = app.key("owner", "viewer", None);
    let problem = create(&viewer, &request(&["g2"], &rfc3339_from_now(-60), None))
        .expect_problem(403, "forbidden");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("reservation.write"),
        "{problem}"
    );
    for (who, org, role) in [
        ("audience", "tenant", "admin"),
        ("managing org", "broker", "capacity-manager"),
        ("stranger", "stranger", "admin"),
    ] {
        let key = app.key(org, role, None);
        let reply = create(&key, &request(&["g3"], &rfc3339_from_now(-60), None));
        assert_eq!(reply.status, 404, "{who}: {}", reply.text());
        reply.expect_problem(404, "not-found");
    }
    create(
        &app.anonymous(),
        &request(&["g3"], &rfc3339_from_now(-60), None),
    )
    .expect_problem(401, "unauthorized");
    app.operator()
        .post(
            "/v1/nodes/n-missing/reservations",
            &request(&["g0"], &rfc3339_from_now(-60), None),
        )
        .expect_problem(404, "not-found");
    assert_eq!(count_reservations(&app), 2);
}

// ------------------------------------------------------------------------------- validation

#[test]
fn unknown_units_orgs_and_duplicates_are_named() {
    let app = market();
    let operator = app.operator();
    let now = rfc3339_from_now(-60);

    let problem = create(&operator, &request(&["g0", "x9", "g1", "x8"], &now, None))
        .expect_problem(422, "unknown-units");
    assert_eq!(problem["unitIds"], json!(["x9", "x8"]));

    let mut body = request(&["g0"], &now, None);
    body["allowedOrgIds"] = json!(["tenant", "ghost-b"]);
    body["managingOrgIds"] = json!(["ghost-a", "broker", "ghost-b"]);
    let problem = create(&operator, &body).expect_problem(422, "unknown-orgs");
    assert_eq!(problem["orgIds"], json!(["ghost-a", "ghost-b"]));

    let problem = create(
        &operator,
        &request(&["g0", "g1", "g0", "g1", "g2"], &now, None),
    )
    .expect_problem(422, "duplicate-ids");
    assert_eq!(problem["field"], "reservedUnitIds");
    assert_eq!(problem["ids"], json!(["g0", "g1"]));
    for field in ["allowedOrgIds", "managingOrgIds"] {
        let mut body = request(&["g0"], &now, None);
        body[field] = json!(["tenant", "broker", "tenant"]);
        let problem = create(&operator, &body).expect_problem(422, "duplicate-ids");
        assert_eq!(problem["field"], field);
        assert_eq!(problem["ids"], json!(["tenant"]));
    }

    let problem = create(&operator, &request(&[], &now, None)).expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "reservedUnitIds");
    let problem = create(&operator, &request(&["g0", "no such/unit"], &now, None))
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "reservedUnitIds");
    let mut body = request(&["g0"], &now, None);
    body["contractRef"] = json!("c".repeat(257));
    let problem = create(&operator, &body).expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "contractRef");
    let mut body = request(&["g0"], &now, None);
    body["reason"] = json!("bad\u{0007}bell");
    let problem = create(&operator, &body).expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "reason");

    let mut body = request(&["g0"], &now, None);
    body["priority"] = json!(1);
    create(&operator, &body).expect_problem(400, "unknown-field");
    let mut body = request(&["g0"], &now, None);
    body.as_object_mut().unwrap().remove("startsAt");
    let problem = create(&operator, &body).expect_problem(400, "missing-field");
    assert_eq!(problem["field"], "startsAt", "{problem}");
    operator
        .send(
            "POST",
            &reservations_path(),
            Some("application/json"),
            Some(b"{\"reservedUnitIds\": [\"g0\"],"),
        )
        .expect_problem(400, "malformed-json");

    assert_eq!(count_reservations(&app), 0, "nothing refused was stored");
}

#[test]
fn the_term_must_be_well_formed_rfc_3339_and_end_after_it_starts() {
    let app = market();
    let operator = app.operator();
    let start = rfc3339_from_now(3600);

    let problem = create(&operator, &request(&["g0"], &start, Some(&start)))
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "endsAt", "endsAt == startsAt");
    let problem = create(
        &operator,
        &request(&["g0"], &start, Some(&rfc3339_from_now(1800))),
    )
    .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "endsAt", "endsAt < startsAt");

    for bad in [
        "tomorrow",
        "2030-01-01",
        "2030-01-01T00:00:00",
        "2030-13-01T00:00:00Z",
        "2030-01-01 00:00:00",
        "",
    ] {
        let problem =
            create(&operator, &request(&["g0"], bad, None)).expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "startsAt", "startsAt {bad:?}");
        let problem = create(&operator, &request(&["g0"], &start, Some(bad)))
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "endsAt", "endsAt {bad:?}");
    }
    assert_eq!(count_reservations(&app), 0);

    // Any offset is accepted and shown in UTC.
    let reservation = create(
        &operator,
        &request(
            &["g0"],
            "2030-01-01T02:00:00+02:00",
            Some("2030-01-01T01:30:00.250Z"),
        ),
    )
    .expect_status(201)
    .json();
    assert_eq!(reservation["startsAt"], "2030-01-01T00:00:00.000Z");
    assert_eq!(reservation["endsAt"], "2030-01-01T01:30:00.250Z");
    assert_eq!(reservation["status"], "pending");
}

#[test]
fn overlapping_terms_on_a_unit_conflict_and_name_units_and_reservations() {
    let app = market();
    let operator = app.operator();
    let first_start = rfc3339_from_now(3600);
    let first_end = rfc3339_from_now(3 * 3600);
    let first = created(&app, &["g0", "g1"], &first_start, Some(&first_end));

    let problem = create(
        &operator,
        &request(
            &["g2", "g1"],
            &rfc3339_from_now(2 * 3600),
            Some(&rfc3339_from_now(4 * 3600)),
        ),
    )
    .expect_problem(409, "reservation-overlap");
    assert_eq!(problem["unitIds"], json!(["g1"]));
    assert_eq!(problem["reservationIds"], json!([first]));

    // Terms are half-open: one may start exactly when the other ends, or end when it starts.
    let after = created(&app, &["g0"], &first_end, None);
    let before = created(&app, &["g1"], &rfc3339_from_now(-3600), Some(&first_start));
    // The same term on other units is no conflict either.
    created(&app, &["g2", "g3"], &first_start, Some(&first_end));

    let problem = create(
        &operator,
        &request(&["g1", "g0", "g4"], &rfc3339_from_now(-60), None),
    )
    .expect_problem(409, "reservation-overlap");
    assert_eq!(problem["unitIds"], json!(["g0", "g1"]));
    assert_eq!(
        problem["reservationIds"],
        json!(sorted(vec![first.clone(), after.clone(), before.clone()]))
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("g0"),
        "{problem}"
    );
    let stored_before = count_reservations(&app);

    // A cancelled reservation holds nothing.
    operator
        .post(&format!("{}/cancel", reservation_path(&first)), &json!({}))
        .expect_status(200);
    let replacement = created(&app, &["g1", "g0"], &first_start, Some(&first_end));
    assert_ne!(replacement, first);
    assert_eq!(count_reservations(&app), stored_before + 1);
}

// ------------------------------------------------------------------------------- status and cancel

#[test]
fn status_follows_the_clock_from_pending_to_active_to_expired() {
    let app = market();
    let viewer = app.key("tenant", "viewer", None);
    let id = created(
        &app,
        &["g0"],
        &rfc3339_from_now(3600),
        Some(&rfc3339_from_now(2 * 3600)),
    );
    let open_ended = created(&app, &["g1"], &rfc3339_from_now(3600), None);

    assert_eq!(status(&viewer, &id), "pending");
    assert_eq!(status(&app.operator(), &open_ended), "pending");

    app.set_clock_offset_secs(3600 + 120);
    assert_eq!(status(&viewer, &id), "active");
    assert_eq!(status(&viewer, &open_ended), "active");
    let active = viewer
        .get(&format!("{}?status=active", reservations_path()))
        .expect_status(200)
        .json();
    assert_eq!(
        sorted(ids(&active)),
        sorted(vec![id.clone(), open_ended.clone()])
    );

    app.set_clock_offset_secs(2 * 3600 + 120);
    assert_eq!(status(&viewer, &id), "expired");
    assert_eq!(
        status(&viewer, &open_ended),
        "active",
        "open-ended never expires"
    );
    let expired = viewer
        .get(&format!("{}?status=expired", reservations_path()))
        .expect_status(200)
        .json();
    assert_eq!(ids(&expired), std::slice::from_ref(&id));

    // The status is derived on read: nothing was written as the clock moved.
    let stored: Vec<String> = app
        .db()
        .prepare("SELECT state FROM reservations ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stored, ["live", "live"]);

    // Back in time, back to pending.
    app.set_clock_offset_secs(0);
    assert_eq!(status(&viewer, &id), "pending");
}

#[test]
fn cancel_is_final_and_only_for_operators_and_the_node_owner() {
    let app = market();
    let manager = app.key("owner", "capacity-manager", None);
    let owner_viewer = app.key("owner", "viewer", None);
    let tenant = app.key("tenant", "admin", None);
    let broker = app.key("broker", "capacity-manager", None);
    let stranger = app.key("stranger", "admin", None);
    let active = created(&app, &["g0", "g1"], &rfc3339_from_now(-3600), None);
    let cancel_path = format!("{}/cancel", reservation_path(&active));

    tenant
        .post(&cancel_path, &json!({}))
        .expect_problem(403, "forbidden");
    broker
        .post(&cancel_path, &json!({}))
        .expect_problem(403, "forbidden");
    owner_viewer
        .post(&cancel_path, &json!({}))
        .expect_problem(403, "forbidden");
    stranger
        .post(&cancel_path, &json!({}))
        .expect_problem(404, "not-found");
    app.anonymous()
        .post(&cancel_path, &json!({}))
        .expect_problem(401, "unauthorized");
    manager
        .post(
            &format!("{}/cancel", reservation_path("rsv-missing")),
            &json!({}),
        )
        .expect_problem(404, "not-found");
    assert_eq!(status(&app.operator(), &active), "active");

    let cancelled = manager
        .post(&cancel_path, &json!({ "reason": "customer churned" }))
        .expect_status(200)
        .json();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(status(&tenant, &active), "cancelled");
    let problem = manager
        .post(&cancel_path, &json!({}))
        .expect_problem(409, "reservation-final");
    assert_eq!(problem["reservationStatus"], "cancelled");
    let problem = app
        .operator()
        .post(
            &format!("{}/release", reservation_path(&active)),
            &json!({ "unitIds": ["g0"] }),
        )
        .expect_problem(409, "reservation-not-active");
    assert_eq!(problem["reservationStatus"], "cancelled");
    app.set_clock_offset_secs(3600);
    assert_eq!(status(&tenant, &active), "cancelled", "stored, not derived");
    app.set_clock_offset_secs(0);

    // A body is optional; a pending reservation may be cancelled too.
    let pending = created(&app, &["g2"], &rfc3339_from_now(3600), None);
    let reply = app.operator().send(
        "POST",
        &format!("{}/cancel", reservation_path(&pending)),
        None,
        None,
    );
    assert_eq!(reply.expect_status(200).json()["status"], "cancelled");

    // An expired reservation is over already.
    let ended = created(
        &app,
        &["g3"],
        &rfc3339_from_now(-7200),
        Some(&rfc3339_from_now(-3600)),
    );
    let problem = app
        .operator()
        .post(&format!("{}/cancel", reservation_path(&ended)), &json!({}))
        .expect_problem(409, "reservation-final");
    assert_eq!(problem["reservationStatus"], "expired");

    manager
        .post(&cancel_path, &json!({ "why": "?" }))
        .expect_problem(400, "unknown-field");
}

// ------------------------------------------------------------------------------- topology → needs-review → re-affirm

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

// ------------------------------------------------------------------------------- listing

#[test]
fn the_list_filters_by_status_and_pages_with_a_cursor() {
    let app = App::start();
    for org in ["owner", "tenant", "broker", "stranger"] {
        app.org(org);
    }
    let units: Vec<String> = (0..25).map(|i| format!("u{i:02}")).collect();
    let unit_refs: Vec<&str> = units.iter().map(String::as_str).collect();
    app.node(NODE, "owner", &unit_refs);

    let mut all = Vec::new();
    let mut cancelled = Vec::new();
    let mut pending = Vec::new();
    for (i, unit) in unit_refs.iter().enumerate() {
        let future = i % 3 == 1;
        let starts_at = if future {
            rfc3339_from_now(3600)
        } else {
            rfc3339_from_now(-3600)
        };
        let id = created(&app, &[unit], &starts_at, None);
        if i % 5 == 4 {
            app.operator()
                .post(&format!("{}/cancel", reservation_path(&id)), &json!({}))
                .expect_status(200);
            cancelled.push(id.clone());
        } else if future {
            pending.push(id.clone());
        }
        all.push(id);
    }
    let viewer = app.key("tenant", "viewer", None);

    // The default page holds 20.
    let first = viewer.get(&reservations_path()).expect_status(200).json();
    assert_eq!(ids(&first).len(), 20);
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = viewer
        .get(&format!("{}?cursor={cursor}", reservations_path()))
        .expect_status(200)
        .json();
    assert_eq!(ids(&second).len(), 5);
    assert!(second.get("nextCursor").is_none(), "{second}");
    let mut paged = ids(&first);
    paged.extend(ids(&second));

    let (items, pages) = list_all(&viewer, "", 7);
    assert_eq!(pages, 4);
    let listed: Vec<String> = items.iter().map(id_of).collect();
    assert_eq!(listed, paged, "any page size gives the same order");
    assert_eq!(
        sorted(listed.clone()),
        sorted(all.clone()),
        "each exactly once"
    );
    let created_at: Vec<&str> = items
        .iter()
        .map(|r| r["createdAt"].as_str().unwrap())
        .collect();
    assert!(created_at.windows(2).all(|w| w[0] <= w[1]), "oldest first");
    let (items, pages) = list_all(&viewer, "", 100);
    assert_eq!((items.len(), pages), (25, 1));
    let (items, pages) = list_all(&viewer, "", 25);
    assert_eq!((items.len(), pages), (25, 1), "no empty last page");

    let (items, _) = list_all(&viewer, "status=cancelled", 2);
    assert_eq!(sorted(items.iter().map(id_of)), sorted(cancelled.clone()));
    assert!(items.iter().all(|r| r["status"] == "cancelled"));
    let (items, _) = list_all(&viewer, "status=pending", 3);
    assert_eq!(sorted(items.iter().map(id_of)), sorted(pending.clone()));
    let (items, _) = list_all(&viewer, "status=active,pending", 4);
    let mut live: Vec<String> = all
        .iter()
        .filter(|id| !cancelled.contains(id))
        .cloned()
        .collect();
    live.sort();
    assert_eq!(sorted(items.iter().map(id_of)), live);
    // The parameter repeated, as clients generated from the OpenAPI document send a list
    // (form style, exploded), means the same; so does a mix of both forms.
    let (items, _) = list_all(&viewer, "status=active&status=pending", 4);
    assert_eq!(sorted(items.iter().map(id_of)), live);
    let (items, _) = list_all(&viewer, "status=active&status=pending,cancelled", 100);
    assert_eq!(items.len(), all.len());
    let (items, _) = list_all(&viewer, "status=pending,cancelled", 100);
    assert_eq!(items.len(), pending.len() + cancelled.len());
    let (items, _) = list_all(&viewer, "status=expired,needs-review", 5);
    assert!(items.is_empty());

    // The clock moves the filter with it: the pending ones become active.
    app.set_clock_offset_secs(3600 + 60);
    let (items, _) = list_all(&viewer, "status=pending", 5);
    assert!(items.is_empty());
    let (items, _) = list_all(&viewer, "status=active", 5);
    assert_eq!(items.len(), live.len());

    for bad in ["status=done", "status=active,", "status=Active"] {
        viewer
            .get(&format!("{}?{bad}", reservations_path()))
            .expect_problem(400, "invalid-parameter");
    }
    for bad in ["limit=0", "limit=101", "limit=ten"] {
        viewer
            .get(&format!("{}?{bad}", reservations_path()))
            .expect_problem(400, "invalid-parameter");
    }
    viewer
        .get(&format!(
            "{}?status=active&status=done",
            reservations_path()
        ))
        .expect_problem(400, "invalid-parameter");
    viewer
        .get(&format!("{}?limit=5&limit=6", reservations_path()))
        .expect_problem(400, "repeated-parameter");
    viewer
        .get(&format!("{}?order=desc", reservations_path()))
        .expect_problem(400, "unknown-parameter");
    viewer
        .get("/v1/nodes/n-missing/reservations")
        .expect_problem(404, "not-found");
}

// ------------------------------------------------------------------------------- visibility

#[test]
fn only_the_parties_and_operators_see_a_reservation() {
    let app = market();
    let shared = created(&app, &["g0"], &rfc3339_from_now(-60), None);
    let private = create(
        &app.operator(),
        &json!({
            "reservedUnitIds": ["g1"],
            "allowedOrgIds": ["owner"],
            "startsAt": rfc3339_from_now(-60),
        }),
    )
    .expect_status(201)
    .json();
    let private = id_of(&private);

    for (who, key) in [
        ("operator", app.operator()),
        ("owner", app.key("owner", "viewer", None)),
        ("audience", app.key("tenant", "viewer", None)),
        ("manager", app.key("broker", "viewer", None)),
    ] {
        let read = key
            .get(&reservation_path(&shared))
            .expect_status(200)
            .json();
        assert_eq!(read["id"], shared, "{who}");
        let (items, _) = list_all(&key, "", 100);
        assert!(items.iter().any(|r| r["id"] == shared), "{who} lists it");
        let sees_private = matches!(who, "operator" | "owner");
        assert_eq!(
            items.iter().any(|r| r["id"] == private),
            sees_private,
            "{who} and the private one"
        );
    }

    let stranger = app.key("stranger", "admin", None);
    let problem = stranger
        .get(&reservation_path(&shared))
        .expect_problem(404, "not-found");
    let missing = stranger
        .get(&reservation_path("rsv-0000000000000000"))
        .expect_problem(404, "not-found");
    assert_eq!(
        problem["detail"], missing["detail"],
        "existence is not leaked"
    );
    let list = stranger.get(&reservations_path()).expect_status(200).json();
    assert_eq!(list["items"], json!([]));
    for status in ["active", "needs-review"] {
        let filtered = stranger
            .get(&format!("{}?status={status}", reservations_path()))
            .expect_status(200)
            .json();
        assert_eq!(filtered["items"], json!([]));
    }
    app.key("tenant", "viewer", None)
        .get(&reservation_path(&private))
        .expect_problem(404, "not-found");

    // A party without reservation.read is refused, not misled.
    let narrowed = app.key("tenant", "admin", Some(&["node.read", "vm.read"]));
    narrowed
        .get(&reservation_path(&shared))
        .expect_problem(403, "forbidden");
    let problem = narrowed
        .get(&reservations_path())
        .expect_problem(403, "forbidden");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("reservation.read"),
        "{problem}"
    );

    // The reservation lives under its node only.
    app.node("n2", "owner", &["g0"]);
    app.operator()
        .get(&format!("/v1/nodes/n2/reservations/{shared}"))
        .expect_problem(404, "not-found");
    app.anonymous()
        .get(&reservation_path(&shared))
        .expect_problem(401, "unauthorized");
}
