//! One error shape everywhere, and strict input: every error is an RFC 9457 problem with a
//! stable `code` and the request id; bodies over the limit are 413, bodies not sent as JSON
//! 415, malformed JSON, wrong types and unknown members 400 naming the field; every response,
//! success or error, carries an x-request-id: the server's own (a client's is recorded beside it
//! in the audit trail).

use serde_json::{Value, json};

use api_support::{App, Client, Reply, ReservationSpec, Scenario, strings};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// An owner org with an admin key, a node `n1` with `units`, and an active reservation of
/// `u0`..`u3`; returns the admin key and the reservation's path.
fn owner_with_reservation(app: &App) -> (Client, String) {
    let made = Scenario::new()
        .org("owner")
        .key("owner", "owner", "admin")
        .node("n1", "owner", &["u0", "u1", "u2", "u3", "u4"])
        .reservation("r", ReservationSpec::on("n1", &["u0", "u1", "u2", "u3"]))
        .make_in(app);
    (made.client("owner"), made.reservation_path("r"))
}

/// A JSON body padded with trailing whitespace to exactly `size` bytes.
fn padded(body: &Value, size: usize) -> Vec<u8> {
    let mut bytes = body.to_string().into_bytes();
    assert!(bytes.len() <= size);
    bytes.resize(size, b' ');
    bytes
}

fn released(app: &App, reservation: &str) -> Vec<String> {
    let now = app.operator().get(reservation).expect_status(200).json();
    strings(&now["releasedUnitIds"])
}

#[test]
fn a_release_body_over_64_kib_is_413_and_changes_nothing() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    let body = json!({ "unitIds": ["u0"] });

    let problem = owner
        .send(
            "POST",
            &release,
            Some("application/json"),
            Some(&padded(&body, 64 * KIB + 1)),
        )
        .expect_problem(413, "payload-too-large");
    assert_eq!(problem["limit"], 64 * KIB);
    assert!(released(&app, &reservation).is_empty());

    // Exactly at the limit is fine.
    owner
        .send(
            "POST",
            &release,
            Some("application/json"),
            Some(&padded(&body, 64 * KIB)),
        )
        .expect_status(200);
    assert_eq!(released(&app, &reservation), ["u0"]);
}

#[test]
fn a_node_body_may_be_8_mib_and_not_more() {
    let app = App::start();
    app.org("owner");
    let operator = app.operator();
    let body = json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g1"] });
    let problem = operator
        .send(
            "PUT",
            "/v1/nodes/n1",
            Some("application/json"),
            Some(&padded(&body, 8 * MIB + 1)),
        )
        .expect_problem(413, "payload-too-large");
    assert_eq!(problem["limit"], 8 * MIB);
    operator
        .get("/v1/nodes/n1")
        .expect_problem(404, "not-found");

    // Far over the 64 KiB default, within the node limit.
    operator
        .send(
            "PUT",
            "/v1/nodes/n1",
            Some("application/json"),
            Some(&padded(&body, 8 * MIB)),
        )
        .expect_status(201);
}

#[test]
fn a_body_not_sent_as_json_is_415() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    let body = json!({ "unitIds": ["u0"] }).to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        None,
    ] {
        owner
            .send("POST", &release, content_type, Some(body.as_bytes()))
            .expect_problem(415, "unsupported-media-type");
    }
    assert!(released(&app, &reservation).is_empty());
    // Parameters and case do not matter.
    owner
        .send(
            "POST",
            &release,
            Some("Application/JSON; charset=utf-8"),
            Some(body.as_bytes()),
        )
        .expect_status(200);
}

#[test]
fn malformed_json_is_400() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    for body in [
        &b"{\"unitIds\": [\"u0\""[..],
        b"{\"unitIds\": [\"u0\"],}",
        b"{unitIds: [\"u0\"]}",
        b"{\"unitIds\": [\"u0\"]} trailing",
        b"{\"unitIds\": [\"u0\"]}{}",
        b"",
        b"\xff\xfe",
    ] {
        let problem = owner
            .send("POST", &release, Some("application/json"), Some(body))
            .expect_problem(400, "malformed-json");
        assert_eq!(problem["title"], "Malformed request");
    }
    assert!(released(&app, &reservation).is_empty());
}

#[test]
fn wrong_types_missing_and_unknown_fields_are_400_naming_the_field() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    let cases = [
        (json!({ "unitIds": "u0" }), "invalid-type", "unitIds"),
        (
            json!({ "unitIds": ["u0", 7] }),
            "invalid-type",
            "unitIds[1]",
        ),
        (
            json!({ "unitIds": ["u0"], "reason": 12 }),
            "invalid-type",
            "reason",
        ),
        // No member is nullable: null is not "absent".
        (
            json!({ "unitIds": ["u0"], "reason": null }),
            "invalid-type",
            "reason",
        ),
        (json!({ "reason": "no units" }), "missing-field", "unitIds"),
        (
            json!({ "unitIds": ["u0"], "units": ["u1"] }),
            "unknown-field",
            "units",
        ),
        (
            json!({ "unitIds": ["u0"], "dryRun": true }),
            "unknown-field",
            "dryRun",
        ),
    ];
    for (body, code, field) in cases {
        let problem = owner.post(&release, &body).expect_problem(400, code);
        assert_eq!(problem["field"], field, "{body}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }
    // A body that is not an object names no field.
    let problem = owner
        .post(&release, &json!("u0"))
        .expect_problem(400, "invalid-type");
    assert!(problem.get("field").is_none(), "{problem}");
    assert!(released(&app, &reservation).is_empty());

    // Optional members of every body refuse null alike.
    for (path, body, field) in [
        ("/v1/orgs", json!({ "id": null, "name": "Null Inc" }), "id"),
        (
            "/v1/orgs/owner/keys",
            json!({ "name": "k", "role": "viewer", "permissions": null }),
            "permissions",
        ),
        (
            "/v1/nodes/n1/reservations",
            json!({ "reservedUnitIds": ["u3"], "startsAt": "2030-01-01T00:00:00Z", "endsAt": null }),
            "endsAt",
        ),
        (
            format!("{reservation}/cancel").as_str(),
            json!({ "reason": null }),
            "reason",
        ),
    ] {
        let problem = app
            .operator()
            .post(path, &body)
            .expect_problem(400, "invalid-type");
        assert_eq!(problem["field"], field, "{path}: {problem}");
    }

    // The same rules on other bodies, nested paths included.
    app.operator()
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": "owner", "unitIds": [["g0"]] }),
        )
        .expect_problem(400, "invalid-type")
        .get("field")
        .map(|f| assert_eq!(f, "unitIds[0]"))
        .expect("field");
    let problem = app
        .operator()
        .post("/v1/orgs", &json!({ "name": "x", "colour": "red" }))
        .expect_problem(400, "unknown-field");
    assert_eq!(problem["field"], "colour");
}

#[test]
fn the_size_limit_comes_before_the_content_type_and_the_content_type_before_parsing() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    owner
        .send(
            "POST",
            &release,
            Some("text/plain"),
            Some(&[b'x'; 70 * KIB]),
        )
        .expect_problem(413, "payload-too-large");
    owner
        .send("POST", &release, Some("text/plain"), Some(b"{not json"))
        .expect_problem(415, "unsupported-media-type");
}

#[test]
fn problems_have_one_shape() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    let problem = owner
        .post(&release, &json!({ "unitIds": ["u0", "zz", "yy"] }))
        .expect_problem(422, "units-not-in-reservation");
    assert_eq!(
        problem["type"],
        "https://api.openrelay.inc/problems/units-not-in-reservation"
    );
    assert_eq!(problem["instance"], release);
    assert_eq!(problem["status"], 422);
    assert_eq!(strings(&problem["unitIds"]), ["yy", "zz"]);

    // Each with the status and code it must get, stated here, not read from the reply.
    for (status, code, reply) in [
        (401, "unauthorized", app.anonymous().get("/v1/whoami")),
        (403, "forbidden", owner.get("/v1/audit/verify")),
        (
            404,
            "not-found",
            owner.get("/v1/nodes/n1/reservations/rsv-none"),
        ),
        (
            405,
            "method-not-allowed",
            owner.send("PATCH", "/v1/nodes/n1", None, None),
        ),
        (400, "unknown-parameter", owner.get("/v1/nodes?page=2")),
        (
            422,
            "invalid-field",
            owner.post(&release, &json!({ "unitIds": [] })),
        ),
    ] {
        let problem = reply.expect_problem(status, code);
        assert_eq!(
            problem["type"],
            format!("https://api.openrelay.inc/problems/{code}")
        );
        assert!(problem["instance"].as_str().unwrap().starts_with("/v1/"));
    }
}

fn assert_request_id(reply: &Reply, what: &str) -> String {
    let id = reply
        .header("x-request-id")
        .unwrap_or_else(|| panic!("{what}: no x-request-id"))
        .to_owned();
    assert!(!id.is_empty(), "{what}");
    if reply.status >= 400 {
        assert_eq!(reply.json()["requestId"], id.as_str(), "{what}");
    }
    id
}

#[test]
fn every_response_carries_a_request_id() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    let replies = [
        ("200", app.anonymous().get("/v1/healthz")),
        ("200", app.anonymous().get("/v1/openapi.json")),
        ("200", owner.get("/v1/whoami")),
        ("401", app.anonymous().get("/v1/nodes")),
        ("404", owner.get("/v1/nodes/n9")),
        ("405", owner.delete("/v1/nodes")),
        ("400", owner.post(&release, &json!({ "x": 1 }))),
        ("413", {
            let big = padded(&json!({}), 65 * KIB);
            owner.send("POST", &release, Some("application/json"), Some(&big))
        }),
        ("415", owner.send("POST", &release, None, Some(b"{}"))),
        ("200", owner.post(&release, &json!({ "unitIds": ["u0"] }))),
        (
            "201",
            app.operator()
                .post("/v1/orgs", &json!({ "name": "Another" })),
        ),
    ];
    let mut ids = std::collections::BTreeSet::new();
    for (what, reply) in &replies {
        // `what` is the status each request must get.
        assert_eq!(reply.status.to_string(), *what, "{}", reply.text());
        let id = assert_request_id(reply, what);
        assert!(
            id.starts_with("req-"),
            "{what}: a generated id looks like req-…: {id}"
        );
        assert!(ids.insert(id), "{what}: request ids are unique");
    }
}

#[test]
fn the_request_id_is_the_servers_and_the_clients_is_kept_beside_it() {
    let app = App::start();
    let (owner, reservation) = owner_with_reservation(&app);
    let release = format!("{reservation}/release");
    // A client's id never becomes the request's id: two callers could send the same one
    // and their audit events would then share it.
    let traced = owner.with_header("x-request-id", "trace-42:abc");
    let ok = traced.post(&release, &json!({ "unitIds": ["u1"] }));
    let ok = ok.expect_status(200);
    let server_id = ok.header("x-request-id").expect("x-request-id").to_owned();
    assert!(server_id.starts_with("req-"), "{server_id}");
    let events = app
        .operator()
        .get("/v1/audit?action=reservation.release")
        .expect_status(200)
        .json();
    assert_eq!(events["items"][0]["requestId"], server_id.as_str());
    assert_eq!(events["items"][0]["clientRequestId"], "trace-42:abc");
    let problem = traced
        .post(&release, &json!({ "unitIds": ["zz"] }))
        .expect_problem(422, "units-not-in-reservation");
    assert!(
        problem["requestId"]
            .as_str()
            .is_some_and(|id| id.starts_with("req-") && id != server_id),
        "{problem}"
    );
    let public = app
        .anonymous()
        .with_header("x-request-id", "probe-1")
        .get("/v1/healthz");
    assert_ne!(public.header("x-request-id"), Some("probe-1"));
    for sent in ["has space", &"r".repeat(129), &"r".repeat(128)] {
        let reply = owner.with_header("x-request-id", sent).get("/v1/whoami");
        let id = reply.header("x-request-id").expect("x-request-id");
        assert_ne!(id, sent);
        assert!(id.starts_with("req-"), "{id}");
    }
}
