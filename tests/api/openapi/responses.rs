//! A realistic scenario's every real response, successes and every kind of error, against
//! the document: a documented status, content type and headers, and a body that validates
//! against the documented schema.

use super::*;

/// Orgs, keys, a node, reservations, release, VMs, dry run, reclaim, cancel, re-affirm,
/// audit, and errors of every kind: every response is checked against the document as it
/// arrives, and at the end every documented (operation, status) below 500 must have been
/// seen, so the document claims nothing the app does not do.
/// The contract's story, told once over one shared spec: every section's answers are checked
/// against the document as they come, and at the end every documented answer must have been
/// seen.
#[test]
fn real_responses_match_the_document() {
    // A short body deadline, so that the 408s below take a second (bodies sent whole are
    // read within microseconds of their head).
    let app = App::start_with(|config| config.env("SPIN_VARIABLE_BODY_DEADLINE_MS", "1000"));
    let spec = Spec::new(repo_document());
    let anonymous = spec.caller(app.anonymous());
    let operator = spec.caller(app.operator());
    meta(&anonymous, &spec);
    orgs(&anonymous, &operator);
    let cast = Cast::new(&app, &spec, anonymous, operator);
    org_keys(&cast);
    operator_keys(&cast);
    nodes(&cast);
    market(&cast);
    let reservation = reservations(&cast);
    release(&cast, &reservation);
    let vms = placements(&cast, &reservation);
    dry_run_and_reclaim(&cast, &reservation, &vms);
    vm_reads_and_termination(&cast, &vms);
    topology_change_and_reaffirm(&cast, &reservation);
    cancel(&cast);
    audit(&cast, &reservation);
    events_feed(&cast);
    strangers_and_bad_keys_are_refused_everywhere(&cast);
    bodies_that_never_arrive_time_out_everywhere(&cast);
    let missing: Vec<_> = spec
        .documented_responses()
        .difference(&spec.seen())
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "documented but never seen (drop them from the document, or show them here): {missing:#?}"
    );
}

/// The callers of the story, each checking every answer against the document.
struct Cast<'s> {
    app: &'s App,
    spec: &'s Spec,
    anonymous: Client,
    operator: Client,
    owner: Client,
    owner_viewer: Client,
    owner_audit_only: Client,
    tenant: Client,
    tenant_capacity: Client,
    guest_capacity: Client,
}

impl<'s> Cast<'s> {
    fn new(app: &'s App, spec: &'s Spec, anonymous: Client, operator: Client) -> Self {
        let key =
            |org, role, permissions| spec.caller(issue(app, &operator, org, role, permissions));
        Cast {
            owner: key("owner", "admin", None),
            owner_viewer: key("owner", "viewer", None),
            owner_audit_only: key("owner", "admin", Some(&["audit.read"])),
            tenant: key("tenant", "member", None),
            tenant_capacity: key("tenant", "capacity-manager", None),
            guest_capacity: key("guest", "capacity-manager", None),
            app,
            spec,
            anonymous,
            operator,
        }
    }

    fn issue(&self, org: &str, role: &str, permissions: Option<&[&str]>) -> Client {
        issue(self.app, &self.operator, org, role, permissions)
    }
}

/// A new key of `org` with `role` (and `permissions`), issued by the operator.
fn issue(
    app: &App,
    operator: &Client,
    org: &str,
    role: &str,
    permissions: Option<&[&str]>,
) -> Client {
    let mut body = json!({ "name": format!("{org} {role}"), "role": role });
    if let Some(list) = permissions {
        body["permissions"] = json!(list);
    }
    let created = operator
        .post(&format!("/v1/orgs/{org}/keys"), &body)
        .expect_status(201)
        .json();
    app.client(created["token"].as_str().expect("token"))
}

/// A reservation of the story: its id and path.
struct Reservation {
    id: String,
    path: String,
}

/// The story's two VMs on the reservation: a spot one and a community one.
struct Vms {
    spot: String,
    community: String,
}

/// `method path` refuses a body of another media type than JSON (415) and one over its limit
/// (413).
fn media_and_size_are_refused(
    caller: &Client,
    method: &str,
    path: &str,
    (content_type, body): (Option<&str>, &[u8]),
    oversize: &[u8],
) {
    caller
        .send(method, path, content_type, Some(body))
        .expect_problem(415, "unsupported-media-type");
    caller
        .send(method, path, Some("application/json"), Some(oversize))
        .expect_problem(413, "payload-too-large");
}

/// A JSON body just over the default limit.
fn over_the_default_limit() -> String {
    json!({ "name": "x".repeat(70 * 1024) }).to_string()
}

/// A body just over the limit of the routes that take a node's unit list.
fn over_the_large_limit() -> Vec<u8> {
    vec![b' '; 9 * 1024 * 1024]
}

/// A capacity request just over the default limit.
fn capacity_over_the_default_limit() -> String {
    json!({ "unitIds": ["u0"], "reason": "r".repeat(65 * 1024) }).to_string()
}

/// Health and the document itself.
fn meta(anonymous: &Client, spec: &Spec) {
    anonymous.get("/v1/healthz").expect_status(200);
    let served = anonymous.get("/v1/openapi.json").expect_status(200).json();
    assert_eq!(
        served, spec.document,
        "the served document is docs/openapi.json"
    );
}

/// Orgs: created, refused, replayed under an idempotency key, read.
fn orgs(anonymous: &Client, operator: &Client) {
    operator.get("/v1/whoami").expect_status(200);
    anonymous
        .get("/v1/whoami")
        .expect_problem(401, "unauthorized");
    operator
        .with_header("idempotency-key", "has space")
        .get("/v1/whoami")
        .expect_problem(400, "invalid-idempotency-key");
    for org in ["owner", "tenant", "guest"] {
        operator
            .post(
                "/v1/orgs",
                &json!({ "id": org, "name": format!("Org {org}") }),
            )
            .expect_status(201);
    }
    operator
        .post("/v1/orgs", &json!({ "id": "owner", "name": "Again" }))
        .expect_problem(409, "already-exists");
    operator
        .post("/v1/orgs", &json!({ "name": "" }))
        .expect_problem(422, "invalid-field");
    operator
        .post("/v1/orgs", &json!({ "name": "x", "colour": "red" }))
        .expect_problem(400, "unknown-field");
    media_and_size_are_refused(
        operator,
        "POST",
        "/v1/orgs",
        (Some("text/plain"), b"name=x"),
        over_the_default_limit().as_bytes(),
    );
    let keyed = operator.with_header("idempotency-key", "create-org-extra");
    keyed
        .post("/v1/orgs", &json!({ "id": "extra", "name": "Extra" }))
        .expect_status(201);
    let replay = keyed.post("/v1/orgs", &json!({ "id": "extra", "name": "Extra" }));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    replay.expect_status(201);
    keyed
        .post("/v1/orgs", &json!({ "id": "other", "name": "Other" }))
        .expect_problem(422, "idempotency-key-reused");
    operator.get("/v1/orgs/owner").expect_status(200);
    operator
        .get("/v1/orgs/nobody")
        .expect_problem(404, "not-found");
}

/// An org's keys: issued, listed, revoked, refused.
fn org_keys(cast: &Cast<'_>) {
    let Cast {
        operator,
        owner,
        owner_viewer,
        tenant,
        app,
        spec,
        ..
    } = cast;
    owner
        .post("/v1/orgs", &json!({ "name": "Mine" }))
        .expect_problem(403, "forbidden");
    operator
        .post(
            "/v1/orgs/nobody/keys",
            &json!({ "name": "k", "role": "admin" }),
        )
        .expect_problem(404, "not-found");
    operator
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "k", "role": "root" }),
        )
        .expect_problem(422, "invalid-field");
    owner_viewer
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "k", "role": "viewer" }),
        )
        .expect_problem(403, "forbidden");
    // An org of its own, filled to its bound of live keys.
    operator
        .post(
            "/v1/orgs",
            &json!({ "id": "many-keys", "name": "Many keys" }),
        )
        .expect_status(201);
    let one_more = json!({ "name": "k", "role": "viewer" });
    for _ in 0..reservations_store::keys::LIVE_KEYS_PER_ORG {
        operator
            .without_contract()
            .post("/v1/orgs/many-keys/keys", &one_more)
            .expect_status(201);
    }
    operator
        .post("/v1/orgs/many-keys/keys", &one_more)
        .expect_problem(409, "too-many-keys");
    media_and_size_are_refused(
        operator,
        "POST",
        "/v1/orgs/owner/keys",
        (Some("text/plain"), b"{}"),
        over_the_default_limit().as_bytes(),
    );
    owner.get("/v1/orgs/owner/keys?limit=2").expect_status(200);
    owner_viewer
        .get("/v1/orgs/owner/keys")
        .expect_problem(403, "forbidden");
    tenant
        .get("/v1/orgs/owner/keys")
        .expect_problem(404, "not-found");
    owner
        .get("/v1/orgs/owner/keys?colour=red")
        .expect_problem(400, "unknown-parameter");
    let spare = owner
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "spare", "role": "viewer" }),
        )
        .expect_status(201)
        .json();
    let spare_id = spare["id"].as_str().expect("id");
    owner_viewer
        .delete(&format!("/v1/orgs/owner/keys/{spare_id}"))
        .expect_problem(403, "forbidden");
    owner
        .delete(&format!("/v1/orgs/owner/keys/{spare_id}"))
        .expect_status(200);
    owner
        .delete("/v1/orgs/owner/keys/key-none")
        .expect_problem(404, "not-found");
    spec.caller(app.client(spare["token"].as_str().expect("token")))
        .get("/v1/whoami")
        .expect_problem(401, "unauthorized");
}

/// Operator keys: issued, listed, revoked, refused.
fn operator_keys(cast: &Cast<'_>) {
    let Cast {
        anonymous,
        operator,
        owner,
        ..
    } = cast;
    let on_call = operator
        .post("/v1/operator/keys", &json!({ "name": "on-call" }))
        .expect_status(201)
        .json();
    let on_call_id = on_call["id"].as_str().expect("id");
    owner
        .post("/v1/operator/keys", &json!({ "name": "mine" }))
        .expect_problem(403, "forbidden");
    operator
        .post("/v1/operator/keys", &json!({ "name": "" }))
        .expect_problem(422, "invalid-field");
    operator
        .post(
            "/v1/operator/keys",
            &json!({ "name": "x", "role": "admin" }),
        )
        .expect_problem(400, "unknown-field");
    media_and_size_are_refused(
        operator,
        "POST",
        "/v1/operator/keys",
        (Some("text/plain"), b"{}"),
        over_the_default_limit().as_bytes(),
    );
    anonymous
        .get("/v1/operator/keys")
        .expect_problem(401, "unauthorized");
    operator.get("/v1/operator/keys?limit=1").expect_status(200);
    owner
        .get("/v1/operator/keys")
        .expect_problem(403, "forbidden");
    operator
        .get("/v1/operator/keys?limit=0")
        .expect_problem(400, "invalid-parameter");
    owner
        .delete(&format!("/v1/operator/keys/{on_call_id}"))
        .expect_problem(403, "forbidden");
    operator
        .with_header("idempotency-key", "has space")
        .delete(&format!("/v1/operator/keys/{on_call_id}"))
        .expect_problem(400, "invalid-idempotency-key");
    anonymous
        .delete(&format!("/v1/operator/keys/{on_call_id}"))
        .expect_problem(401, "unauthorized");
    operator
        .delete(&format!("/v1/operator/keys/{on_call_id}"))
        .expect_status(200);
    operator
        .delete("/v1/operator/keys/opk-none")
        .expect_problem(404, "not-found");
}

/// Nodes: put, listed, read, refused.
fn nodes(cast: &Cast<'_>) {
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
fn market(cast: &Cast<'_>) {
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

/// Reservations: created, refused, listed, read.
fn reservations(cast: &Cast<'_>) -> Reservation {
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

/// Release: units put on the market, refusals.
fn release(cast: &Cast<'_>, reservation: &Reservation) {
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
fn placements(cast: &Cast<'_>, reservation: &Reservation) -> Vms {
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
fn dry_run_and_reclaim(cast: &Cast<'_>, reservation: &Reservation, vms: &Vms) {
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
fn vm_reads_and_termination(cast: &Cast<'_>, vms: &Vms) {
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

/// A node change withholds the reservation until an operator re-affirms it.
fn topology_change_and_reaffirm(cast: &Cast<'_>, reservation: &Reservation) {
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
fn cancel(cast: &Cast<'_>) {
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

/// The audit trail and its verification.
fn audit(cast: &Cast<'_>, reservation: &Reservation) {
    let Cast {
        anonymous,
        operator,
        owner,
        tenant,
        ..
    } = cast;
    let rid = &reservation.id;
    let events = owner
        .get("/v1/audit?nodeId=n1&limit=3")
        .expect_status(200)
        .json();
    assert!(events["nextCursor"].is_string(), "{events}");
    owner
        .get(&format!(
            "/v1/audit?reservationId={rid}&action=reservation.reclaim&since={}",
            rfc3339_from_now(-600).replace('+', "%2B")
        ))
        .expect_status(200);
    owner
        .get("/v1/audit?action=reservation.explode")
        .expect_problem(400, "invalid-parameter");
    tenant.get("/v1/audit").expect_problem(403, "forbidden");
    operator.get("/v1/audit/verify").expect_status(200);
    owner
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    operator
        .get("/v1/audit/verify?deep=1")
        .expect_problem(400, "unknown-parameter");
    anonymous
        .get("/v1/audit/verify")
        .expect_problem(401, "unauthorized");
}

/// The events feed, with its bound on waiting polls.
fn events_feed(cast: &Cast<'_>) {
    let Cast {
        owner,
        tenant,
        spec,
        ..
    } = cast;
    let feed = owner.get("/v1/events?limit=2").expect_status(200).json();
    let cursor = feed["nextCursor"].as_str().expect("a cursor").to_owned();
    tenant
        .get(&format!("/v1/events?after={cursor}&wait=0"))
        .expect_status(200);
    owner
        .get("/v1/events?wait=31")
        .expect_problem(400, "invalid-parameter");
    spec.caller(cast.issue("owner", "admin", Some(&["node.read"])))
        .get("/v1/events")
        .expect_problem(403, "forbidden");
    // A key with four polls waiting may not open a fifth.
    let poller = cast.issue("owner", "viewer", None);
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let poller = poller.clone();
            std::thread::spawn(move || poller.get("/v1/events?after=999999999&wait=10"))
        })
        .collect();
    let poller_key = api_support::key_id(&poller);
    api_support::until(
        "the key's four polls hold their places",
        std::time::Duration::from_secs(60),
        || cast.app.feed_waits_of(&poller_key) == 4,
    );
    spec.caller(poller)
        .get("/v1/events?after=999999999&wait=10")
        .expect_problem(429, "too-many-waits");
    for poll in waiting {
        poll.join().expect("a waiting poll").expect_status(200);
    }
}

/// Every authenticated operation: 401 with the Bearer challenge for an unknown token, and
/// 400 for an Idempotency-Key that is not 1-255 visible ASCII characters.
fn strangers_and_bad_keys_are_refused_everywhere(cast: &Cast<'_>) {
    let Cast {
        operator,
        app,
        spec,
        ..
    } = cast;
    let forged = spec.caller(app.client("gpr.key-0000.0000"));
    let bad_key = operator.with_header("idempotency-key", "not valid");
    let seen = spec.seen();
    let operations: BTreeSet<(String, String)> = seen
        .iter()
        .filter(|(_, template, _)| template != "/v1/healthz" && template != "/v1/openapi.json")
        .map(|(method, template, _)| (method.clone(), template.clone()))
        .collect();
    for (method, template) in &operations {
        let path = template
            .split('/')
            .map(|s| if s.starts_with('{') { "x1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let reply = forged.send(method, &path, Some("application/json"), Some(b"{}"));
        assert!(
            reply
                .header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")),
            "{method} {path}: 401 without the Bearer challenge"
        );
        reply.expect_problem(401, "unauthorized");
        bad_key
            .send(method, &path, Some("application/json"), Some(b"{}"))
            .expect_problem(400, "invalid-idempotency-key");
    }
}

/// Every operation that takes a body: 408 when the body does not arrive in time.
fn bodies_that_never_arrive_time_out_everywhere(cast: &Cast<'_>) {
    let Cast { app, spec, .. } = cast;
    let slow: Vec<(String, String)> = spec
        .documented_responses()
        .into_iter()
        .filter(|(_, _, status)| *status == 408)
        .map(|(method, template, _)| (method, template))
        .collect();
    std::thread::scope(|scope| {
        for (method, template) in &slow {
            let (app, spec) = (&app, &spec);
            scope.spawn(move || {
                let path = template
                    .split('/')
                    .map(|s| if s.starts_with('{') { "x1" } else { s })
                    .collect::<Vec<_>>()
                    .join("/");
                let answer = body_never_finished(app, method, &path);
                assert!(
                    answer.starts_with("HTTP/1.1 408")
                        && answer.contains("application/problem+json")
                        && answer.contains("\"code\":\"request-timeout\""),
                    "{method} {path}: {answer}"
                );
                spec.contract.record(method, template, 408);
            });
        }
    });
}

/// Sends the operator's `method path` with a body that never finishes arriving, and returns
/// the server's answer.
fn body_never_finished(app: &App, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let address = app.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OPERATOR_TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: 10\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).expect("send");
    // The head and the body may come in separate reads: read until the whole answer is in.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    while !is_whole_answer(&answer) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether `answer` holds an HTTP head and its whole body.
fn is_whole_answer(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    match length {
        Some(length) => body.len() >= length,
        // Chunked: the last chunk is empty.
        None => body.ends_with("0\r\n\r\n"),
    }
}
