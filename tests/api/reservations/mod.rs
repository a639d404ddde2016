//! Reservations over HTTP: who may create them, every validation error, the status derived
//! from the (test-controlled) clock, cancel, topology change → needs-review → re-affirm,
//! listing with status filters and cursors, and who may see a reservation at all.

use serde_json::{Value, json};

use api_support::{
    App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, rfc3339_from_now, sorted, strings,
};

mod listing;
mod topology;
mod visibility;

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
