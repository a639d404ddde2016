//! Orgs, their keys and operator keys.

use super::*;

/// Orgs: created, refused, replayed under an idempotency key, read.
pub(super) fn orgs(anonymous: &Client, operator: &Client) {
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
pub(super) fn org_keys(cast: &Cast<'_>) {
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
pub(super) fn operator_keys(cast: &Cast<'_>) {
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
