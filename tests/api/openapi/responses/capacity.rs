//! Nodes, the market, release, spot and community VMs, dry run and reclaim.

use super::*;

/// Nodes: put, listed, read, refused.
pub(super) fn nodes(cast: &Cast<'_>) {
    let Cast {
        operator,
        owner,
        owner_audit_only,
        ..
    } = cast;
    let units: Vec<String> = (0..8).map(|i| format!("u{i}")).collect();
    operator
        .put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": units }),
        )
        .expect_status(201);
    operator
        .put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": units }),
        )
        .expect_status(200);
    operator
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": "nobody", "unitIds": ["a"] }),
        )
        .expect_problem(422, "unknown-orgs");
    operator
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": "owner", "unitIds": "a" }),
        )
        .expect_problem(400, "invalid-type");
    owner
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": "owner", "unitIds": ["a"] }),
        )
        .expect_problem(403, "forbidden");
    operator
        .put(
            "/v1/nodes/bad%20id",
            &json!({ "ownerOrgId": "owner", "unitIds": ["a"] }),
        )
        .expect_problem(404, "not-found");
    media_and_size_are_refused(
        operator,
        "PUT",
        "/v1/nodes/n2",
        (None, b"{}"),
        &over_the_large_limit(),
    );
    owner
        .get("/v1/nodes?ownerOrgId=owner&limit=1")
        .expect_status(200);
    owner
        .get("/v1/nodes?limit=0")
        .expect_problem(400, "invalid-parameter");
    owner_audit_only
        .get("/v1/nodes")
        .expect_problem(403, "forbidden");
    owner.get("/v1/nodes/n1").expect_status(200);
    owner_audit_only
        .get("/v1/nodes/n1")
        .expect_problem(403, "forbidden");
    owner.get("/v1/nodes/n9").expect_problem(404, "not-found");
}

/// The spot market.
pub(super) fn market(cast: &Cast<'_>) {
    let Cast {
        owner,
        owner_audit_only,
        ..
    } = cast;
    owner.get("/v1/market").expect_status(200);
    owner.get("/v1/market?nodeId=n1&limit=1").expect_status(200);
    owner
        .get("/v1/market?cursor=not-a-cursor")
        .expect_problem(400, "invalid-parameter");
    owner
        .get("/v1/market?limit=1001")
        .expect_problem(400, "invalid-parameter");
    owner_audit_only
        .get("/v1/market")
        .expect_problem(403, "forbidden");
}

/// Release: units put on the market, refusals.
pub(super) fn release(cast: &Cast<'_>, reservation: &Reservation) {
    let Cast {
        owner,
        tenant,
        guest_capacity,
        ..
    } = cast;
    let base = &reservation.path;
    owner
        .post(
            &format!("{base}/release"),
            &json!({ "unitIds": ["u0", "u1"], "reason": "idle" }),
        )
        .expect_status(200);
    owner
        .with_header("prefer", "return=minimal")
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u1"] }))
        .expect_status(200);
    tenant
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(404, "not-found");
    guest_capacity
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(403, "forbidden");
    owner
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u6"] }))
        .expect_problem(422, "units-not-in-reservation");
    owner
        .post(
            &format!("{base}/release"),
            &json!({ "unitIds": ["u0"], "extra": 1 }),
        )
        .expect_problem(400, "unknown-field");
    media_and_size_are_refused(
        owner,
        "POST",
        &format!("{base}/release"),
        (Some("text/plain"), b"u0"),
        capacity_over_the_default_limit().as_bytes(),
    );
}

/// VMs placed on released and reserved units, and refused.
pub(super) fn placements(cast: &Cast<'_>, reservation: &Reservation) -> Vms {
    let Cast {
        operator,
        owner,
        tenant,
        guest_capacity,
        ..
    } = cast;
    let base = &reservation.path;
    let market = guest_capacity
        .get("/v1/market?nodeId=n1")
        .expect_status(200)
        .json();
    assert_eq!(
        market["items"].as_array().map(Vec::len),
        Some(2),
        "{market}"
    );
    let spot = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u0"], "tier": "spot" }),
        )
        .expect_status(201);
    let spot_location = spot.header("location").map(str::to_owned);
    let vm_spot = spot.created_id();
    assert_eq!(spot_location, Some(format!("/v1/vms/{vm_spot}")));
    let vm_com = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u2"], "tier": "community" }),
        )
        .created_id();
    tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "verified" }),
        )
        .expect_problem(409, "placement-refused");
    tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "gold" }),
        )
        .expect_problem(422, "invalid-field");
    tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n9", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(404, "not-found");
    operator
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(403, "forbidden");
    tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": [1], "tier": "spot" }),
        )
        .expect_problem(400, "invalid-type");
    let big_vm =
        json!({ "nodeId": "n1", "unitIds": vec!["u1"; 20_000], "tier": "spot" }).to_string();
    media_and_size_are_refused(
        tenant,
        "POST",
        "/v1/vms",
        (Some("application/xml"), b"<vm/>"),
        big_vm.as_bytes(),
    );
    owner
        .post(&format!("{base}/release"), &json!({ "unitIds": ["u2"] }))
        .expect_problem(409, "units-not-idle");

    Vms {
        spot: vm_spot,
        community: vm_com,
    }
}

/// The dry run says exactly what the reclaim then does.
pub(super) fn dry_run_and_reclaim(cast: &Cast<'_>, reservation: &Reservation, vms: &Vms) {
    let Cast {
        owner,
        tenant,
        tenant_capacity,
        guest_capacity,
        ..
    } = cast;
    let base = &reservation.path;
    let (vm_spot, vm_com) = (&vms.spot, &vms.community);
    let dry_run = owner
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u0", "u2"] }),
        )
        .expect_status(200)
        .json();
    assert_eq!(dry_run["wouldTerminate"], json!([vm_spot]));
    assert_eq!(dry_run["wouldSkip"], json!([vm_com]));
    owner
        .with_header("prefer", "return=minimal")
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u0"] }),
        )
        .expect_status(200);
    tenant
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u0"] }),
        )
        .expect_problem(404, "not-found");
    guest_capacity
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u0"] }),
        )
        .expect_problem(403, "forbidden");
    owner
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": ["u7"] }),
        )
        .expect_problem(422, "units-not-in-reservation");
    owner
        .post(
            &format!("{base}/reclaim/dry-run"),
            &json!({ "unitIds": "u0" }),
        )
        .expect_problem(400, "invalid-type");
    media_and_size_are_refused(
        owner,
        "POST",
        &format!("{base}/reclaim/dry-run"),
        (None, b"{}"),
        capacity_over_the_default_limit().as_bytes(),
    );

    let reclaimed = tenant_capacity
        .post(
            &format!("{base}/reclaim"),
            &json!({ "unitIds": ["u0", "u2"], "reason": "need it back" }),
        )
        .expect_status(200)
        .json();
    assert_eq!(reclaimed["terminated"], json!([vm_spot]));
    assert_eq!(reclaimed["skipped"], json!([vm_com]));
    owner
        .with_header("prefer", "return=minimal")
        .post(&format!("{base}/reclaim"), &json!({ "unitIds": ["u1"] }))
        .expect_status(200);
    tenant
        .post(&format!("{base}/reclaim"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(404, "not-found");
    guest_capacity
        .post(&format!("{base}/reclaim"), &json!({ "unitIds": ["u0"] }))
        .expect_problem(403, "forbidden");
    owner
        .post(&format!("{base}/reclaim"), &json!({ "unitIds": [] }))
        .expect_problem(422, "invalid-field");
    owner
        .send(
            "POST",
            &format!("{base}/reclaim"),
            Some("application/json"),
            Some(b"{\"unitIds\": [\"u0\""),
        )
        .expect_problem(400, "malformed-json");
    media_and_size_are_refused(
        owner,
        "POST",
        &format!("{base}/reclaim"),
        (Some("text/plain"), b"{}"),
        capacity_over_the_default_limit().as_bytes(),
    );
}

/// VMs listed, read and terminated.
pub(super) fn vm_reads_and_termination(cast: &Cast<'_>, vms: &Vms) {
    let Cast {
        owner_viewer,
        owner_audit_only,
        tenant,
        guest_capacity,
        ..
    } = cast;
    let com_path = format!("/v1/vms/{}", vms.community);

    tenant
        .get("/v1/vms?nodeId=n1&status=running&limit=10")
        .expect_status(200);
    tenant
        .get("/v1/vms?status=asleep")
        .expect_problem(400, "invalid-parameter");
    owner_audit_only
        .get("/v1/vms")
        .expect_problem(403, "forbidden");
    tenant.get(&com_path).expect_status(200);
    owner_audit_only
        .get(&com_path)
        .expect_problem(403, "forbidden");
    tenant
        .get("/v1/vms/vm-none")
        .expect_problem(404, "not-found");
    tenant
        .get(&format!("{com_path}?x=1"))
        .expect_problem(400, "unknown-parameter");
    owner_viewer
        .delete(&com_path)
        .expect_problem(403, "forbidden");
    guest_capacity
        .delete(&com_path)
        .expect_problem(404, "not-found");
    tenant.delete(&com_path).expect_status(200);
    tenant
        .delete(&com_path)
        .expect_problem(409, "vm-terminated");
}
