//! Reservations: creation, listing, a topology change and its re-affirmation, cancellation.

use super::*;

/// Reservations: created, refused, listed, read.
pub(super) fn reservations(cast: &Cast<'_>) -> Reservation {
    let Cast {
        owner,
        owner_viewer,
        owner_audit_only,
        tenant,
        ..
    } = cast;
    let reserved = owner
        .post(
            "/v1/nodes/n1/reservations",
            &json!({
                "reservedUnitIds": ["u0", "u1", "u2", "u3"],
                "allowedOrgIds": ["tenant", "guest"],
                "managingOrgIds": ["tenant"],
                "startsAt": rfc3339_from_now(-3600),
                "contractRef": "c-1",
                "reason": "quarterly contract",
            }),
        )
        .expect_status(201)
        .json();
    let rid = reserved["id"].as_str().expect("id").to_owned();
    let base = format!("/v1/nodes/n1/reservations/{rid}");
    owner
        .post(
            "/v1/nodes/n1/reservations",
            &json!({ "reservedUnitIds": ["u3"], "allowedOrgIds": [], "startsAt": rfc3339_from_now(0) }),
        )
        .expect_problem(409, "reservation-overlap");
    owner
        .post(
            "/v1/nodes/n1/reservations",
            &json!({ "reservedUnitIds": ["zz"], "allowedOrgIds": [], "startsAt": rfc3339_from_now(0) }),
        )
        .expect_problem(422, "unknown-units");
    owner
        .post("/v1/nodes/n1/reservations", &json!({ "allowedOrgIds": [] }))
        .expect_problem(400, "missing-field");
    owner_viewer
        .post(
            "/v1/nodes/n1/reservations",
            &json!({ "reservedUnitIds": ["u7"], "allowedOrgIds": [], "startsAt": rfc3339_from_now(0) }),
        )
        .expect_problem(403, "forbidden");
    tenant
        .post(
            "/v1/nodes/n1/reservations",
            &json!({ "reservedUnitIds": ["u7"], "allowedOrgIds": [], "startsAt": rfc3339_from_now(0) }),
        )
        .expect_problem(404, "not-found");
    media_and_size_are_refused(
        owner,
        "POST",
        "/v1/nodes/n1/reservations",
        (Some("text/plain"), b"{}"),
        &over_the_large_limit(),
    );
    owner
        .get("/v1/nodes/n1/reservations?status=active&status=pending")
        .expect_status(200);
    owner
        .get("/v1/nodes/n1/reservations?status=soon")
        .expect_problem(400, "invalid-parameter");
    owner
        .get("/v1/nodes/n9/reservations")
        .expect_problem(404, "not-found");
    owner_audit_only
        .get("/v1/nodes/n1/reservations")
        .expect_problem(403, "forbidden");
    tenant.get(&base).expect_status(200);
    owner_audit_only.get(&base).expect_problem(403, "forbidden");
    owner
        .get(&format!("{base}?x=1"))
        .expect_problem(400, "unknown-parameter");
    owner
        .get("/v1/nodes/n1/reservations/rsv-none")
        .expect_problem(404, "not-found");

    Reservation {
        id: rid,
        path: base,
    }
}

/// A node change withholds the reservation until an operator re-affirms it.
pub(super) fn topology_change_and_reaffirm(cast: &Cast<'_>, reservation: &Reservation) {
    let Cast {
        operator,
        owner,
        tenant,
        ..
    } = cast;
    let (rid, base) = (&reservation.id, &reservation.path);
    tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u6"], "tier": "verified" }),
        )
        .expect_status(201);
    operator
        .put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": ["u0", "u1"] }),
        )
        .expect_problem(409, "units-in-use");
    let changed = owner
        .put("/v1/nodes/n1", &json!({ "ownerOrgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4", "u5", "u6"] }))
        .expect_status(200)
        .json();
    assert_eq!(changed["withheldReservationIds"], json!([rid]));
    owner
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(409, "reservation-not-active");
    owner
        .post(&format!("{base}/reclaim"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(409, "reservation-not-active");
    owner
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u0"] }),
        )
        .expect_problem(409, "reservation-not-active");
    owner
        .post(&format!("{base}/reaffirm"), &json!({ "reason": "checked" }))
        .expect_problem(403, "forbidden");
    operator
        .post("/v1/nodes/n1/reservations/rsv-none/reaffirm", &json!({}))
        .expect_problem(404, "not-found");
    operator
        .post(
            &format!("{base}/reaffirm"),
            &json!({ "reservedUnitIds": ["u0", "u9"] }),
        )
        .expect_problem(422, "unknown-units");
    operator
        .post(
            &format!("{base}/reaffirm"),
            &json!({ "reservedUnitIds": "u0" }),
        )
        .expect_problem(400, "invalid-type");
    media_and_size_are_refused(
        operator,
        "POST",
        &format!("{base}/reaffirm"),
        (Some("text/plain"), b"{}"),
        &over_the_large_limit(),
    );
    operator
        .post(
            &format!("{base}/reaffirm"),
            &json!({ "reason": "topology checked" }),
        )
        .expect_status(200);
    operator
        .post(&format!("{base}/reaffirm"), &json!({}))
        .expect_problem(409, "reservation-not-needs-review");
}

/// A second reservation, cancelled.
pub(super) fn cancel(cast: &Cast<'_>) {
    let Cast {
        owner,
        tenant,
        guest_capacity,
        ..
    } = cast;
    let second = owner
        .post(
            "/v1/nodes/n1/reservations",
            &json!({ "reservedUnitIds": ["u4", "u5"], "allowedOrgIds": ["tenant"], "startsAt": rfc3339_from_now(-60) }),
        )
        .expect_status(201)
        .json();
    let second = format!(
        "/v1/nodes/n1/reservations/{}",
        second["id"].as_str().expect("id")
    );
    tenant
        .post(&format!("{second}/cancel"), &json!({}))
        .expect_problem(403, "forbidden");
    guest_capacity
        .post(&format!("{second}/cancel"), &json!({}))
        .expect_problem(404, "not-found");
    owner
        .post(
            &format!("{second}/cancel"),
            &json!({ "reason": "x".repeat(2000) }),
        )
        .expect_problem(422, "invalid-field");
    owner
        .post(&format!("{second}/cancel"), &json!({ "why": "x" }))
        .expect_problem(400, "unknown-field");
    media_and_size_are_refused(
        owner,
        "POST",
        &format!("{second}/cancel"),
        (Some("text/plain"), b"x"),
        capacity_over_the_default_limit().as_bytes(),
    );
    owner
        .send("POST", &format!("{second}/cancel"), None, None)
        .expect_status(200);
    owner
        .post(&format!("{second}/cancel"), &json!({ "reason": "again" }))
        .expect_problem(409, "reservation-final");
}
