//! Operator keys: above all orgs, listed and revoked.

use super::*;

#[test]
fn operator_keys_stand_above_all_orgs() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    let reply = operator
        .post("/v1/operator/keys", &json!({ "name": "on-call" }))
        .expect_status(201);
    let created = reply.json();
    let id = created["id"].as_str().unwrap();
    assert_eq!(
        reply.header("location"),
        Some(format!("/v1/operator/keys/{id}").as_str())
    );
    assert!(id.starts_with("opk-"), "{created}");
    assert_eq!(created["operator"], true);
    assert_eq!(created["status"], "active");
    assert_eq!(created["createdBy"], "operator");
    let token = created["token"].as_str().unwrap();
    let secret = token
        .strip_prefix(&format!("gpr.{id}."))
        .expect("gpr.<key id>.<secret>");
    assert_eq!(secret.len(), 64);
    let stored: String = app
        .db()
        .query_row(
            "SELECT secret_hash FROM operator_keys WHERE id = ?",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, hex::encode(Sha256::digest(secret.as_bytes())));

    let key = app.client(token);
    let me = key.get("/v1/whoami").expect_status(200).json();
    assert_eq!(me["keyId"], id);
    assert_eq!(me["operator"], true);
    assert_eq!(me["orgId"], Value::Null);
    let mut usable: Vec<&str> = ROLE_PERMISSIONS[0].1.to_vec();
    usable.retain(|p| *p != "vm.write");
    assert_eq!(strings(&me["permissions"]), sorted(&usable));
    // It does what the bootstrap credential does, and is named as the actor.
    key.post("/v1/orgs", &json!({ "id": "beta", "name": "Beta" }))
        .expect_status(201);
    let org_key = key
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "k", "role": "viewer" }),
        )
        .expect_status(201)
        .json();
    assert_eq!(org_key["createdBy"], id);
    let second = key
        .post("/v1/operator/keys", &json!({ "name": "second" }))
        .expect_status(201)
        .json();
    assert_eq!(second["createdBy"], id);
    key.get("/v1/orgs/acme/keys").expect_status(200);
    key.get("/v1/audit/verify").expect_status(200);
    // ...except placing VMs: an operator has no org to run them for.
    app.node("n1", "acme", &["u1"]);
    key.post(
        "/v1/vms",
        &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
    )
    .expect_problem(403, "forbidden");

    // Org keys, even admins, cannot touch operator keys.
    let admin = app.key("acme", "admin", None);
    admin
        .post("/v1/operator/keys", &json!({ "name": "mine" }))
        .expect_problem(403, "forbidden");
    admin
        .get("/v1/operator/keys")
        .expect_problem(403, "forbidden");
    admin
        .delete(&format!("/v1/operator/keys/{id}"))
        .expect_problem(403, "forbidden");
    expect_unauthorized(app.anonymous().get("/v1/operator/keys"));
    key.get("/v1/whoami").expect_status(200);

    for (body, status, code) in [
        (json!({}), 400, "missing-field"),
        (json!({ "name": "" }), 422, "invalid-field"),
        (
            json!({ "name": "x", "role": "admin" }),
            400,
            "unknown-field",
        ),
        (
            json!({ "name": "x", "orgId": "acme" }),
            400,
            "unknown-field",
        ),
    ] {
        operator
            .post("/v1/operator/keys", &body)
            .expect_problem(status, code);
    }
}

#[test]
fn operator_keys_are_listed_and_revoked() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    let mut created = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..5 {
        let key = operator
            .post("/v1/operator/keys", &json!({ "name": format!("op {i}") }))
            .expect_status(201)
            .json();
        created.push(key["id"].as_str().unwrap().to_owned());
        tokens.push(key["token"].as_str().unwrap().to_owned());
    }
    let mut seen = Vec::new();
    let mut path = "/v1/operator/keys?limit=2".to_owned();
    loop {
        let reply = operator.get(&path).expect_status(200);
        for token in &tokens {
            let secret = token.rsplit('.').next().unwrap();
            assert!(!reply.text().contains(secret), "a listing leaks a secret");
        }
        let page = reply.json();
        for item in page["items"].as_array().unwrap() {
            assert!(item.get("token").is_none());
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/v1/operator/keys?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, created);
    operator
        .get("/v1/operator/keys?limit=0")
        .expect_problem(400, "invalid-parameter");

    // Revoked: refused from the next request on; revoking again changes nothing.
    let victim = app.client(&tokens[0]);
    victim.get("/v1/whoami").expect_status(200);
    let revoker = app.client(&tokens[1]);
    let revoked = revoker
        .delete(&format!("/v1/operator/keys/{}", created[0]))
        .expect_status(200)
        .json();
    assert_eq!(revoked["status"], "revoked");
    assert!(revoked["revokedAt"].is_string());
    expect_unauthorized(victim.get("/v1/whoami"));
    expect_unauthorized(victim.get("/v1/operator/keys"));
    let again = operator
        .delete(&format!("/v1/operator/keys/{}", created[0]))
        .expect_status(200)
        .json();
    assert_eq!(again, revoked);
    // A key may revoke itself.
    revoker
        .delete(&format!("/v1/operator/keys/{}", created[1]))
        .expect_status(200);
    expect_unauthorized(revoker.get("/v1/whoami"));
    app.client(&tokens[2]).get("/v1/whoami").expect_status(200);

    // Org keys and operator keys live apart; the bootstrap credential is no row to revoke.
    let org_key = operator
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "k", "role": "viewer" }),
        )
        .expect_status(201)
        .json();
    for path in [
        format!("/v1/operator/keys/{}", org_key["id"].as_str().unwrap()),
        format!("/v1/orgs/acme/keys/{}", created[2]),
        "/v1/operator/keys/operator".to_owned(),
        "/v1/operator/keys/opk-0000000000000000".to_owned(),
    ] {
        operator.delete(&path).expect_problem(404, "not-found");
    }
    app.client(org_key["token"].as_str().unwrap())
        .get("/v1/whoami")
        .expect_status(200);
    app.client(&tokens[2]).get("/v1/whoami").expect_status(200);
    operator.get("/v1/whoami").expect_status(200);
}
