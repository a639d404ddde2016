//! An org's keys: tokens shown once, roles and narrowed permissions, validation, listing,
//! revocation, the bound on live keys, and an org managing its own keys only.

use super::*;

#[test]
fn a_key_token_is_shown_once_and_only_its_hash_is_stored() {
    let app = App::start();
    app.org("acme");
    let (created, client) = create_key(
        &app,
        &app.operator(),
        "acme",
        json!({ "name": "ci", "role": "viewer" }),
    );
    let token = created["token"].as_str().unwrap().to_owned();
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "gpr.<key id>.<secret>: {token}");
    assert_eq!(parts[0], "gpr");
    assert_eq!(parts[1], created["id"]);
    let secret = parts[2];
    assert_eq!(secret.len(), 64, "a 256-bit secret, hex");
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(created["orgId"], "acme");
    assert_eq!(created["role"], "viewer");
    assert_eq!(created["status"], "active");
    assert_eq!(created["createdBy"], "operator");
    assert!(created.get("secretHash").is_none() && created.get("secret").is_none());
    client.get("/v1/whoami").expect_status(200);

    // Listing shows the key, never its token nor its hash.
    let listing = app.operator().get("/v1/orgs/acme/keys").expect_status(200);
    let listed = listing.json();
    let text = listing.text();
    assert!(!text.contains(secret), "the listing leaks the secret");
    let expected_hash = hex::encode(Sha256::digest(secret.as_bytes()));
    assert!(!text.contains(&expected_hash), "the listing leaks the hash");
    let item = &listed["items"][0];
    assert_eq!(item["id"], created["id"]);
    for member in ["token", "secret", "secretHash", "hash"] {
        assert!(item.get(member).is_none(), "{member} listed: {item}");
    }
    let mut without_token = created.clone();
    without_token.as_object_mut().unwrap().remove("token");
    assert_eq!(
        item, &without_token,
        "creation shows the listed key plus the token"
    );

    // Behind the API: a 64-hex SHA-256 of the secret, and the secret nowhere in the database.
    let db = app.db();
    let stored: String = db
        .query_row(
            "SELECT secret_hash FROM api_keys WHERE id = ?",
            [created["id"].as_str().unwrap()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored.len(), 64);
    assert!(stored.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(stored, expected_hash);
    let mut statement = db.prepare("SELECT * FROM api_keys").unwrap();
    let columns = statement.column_count();
    let mut rows = statement.query([]).unwrap();
    while let Some(row) = rows.next().unwrap() {
        for i in 0..columns {
            // Every column is looked at, whatever its type: text and blobs byte by byte.
            let bytes: &[u8] = match row.get_ref(i).unwrap() {
                rusqlite::types::ValueRef::Text(bytes) | rusqlite::types::ValueRef::Blob(bytes) => {
                    bytes
                }
                rusqlite::types::ValueRef::Null
                | rusqlite::types::ValueRef::Integer(_)
                | rusqlite::types::ValueRef::Real(_) => continue,
            };
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "column {i} holds the secret"
            );
        }
    }
    drop(rows);
    drop(statement);
    drop(db);
    // The databases must be there to be scanned; a write-ahead log may have been
    // checkpointed away (then its content is in the database), but nothing else is skipped.
    for (file, required) in [
        ("sqlite_db.db", true),
        ("sqlite_db.db-wal", false),
        ("sqlite_key_value.db", true),
        ("sqlite_key_value.db-wal", false),
    ] {
        let bytes = match std::fs::read(app.state_dir().join(file)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => continue,
            Err(e) => panic!("{file} cannot be scanned: {e}"),
        };
        assert!(!bytes.is_empty() || !required, "{file} is empty");
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{file} holds the secret"
        );
    }
}

#[test]
fn each_role_holds_its_documented_permissions() {
    let app = App::start();
    app.org("acme");
    for (role, permissions) in ROLE_PERMISSIONS {
        let (created, client) = create_key(
            &app,
            &app.operator(),
            "acme",
            json!({ "name": format!("{role} key"), "role": role }),
        );
        assert_eq!(
            strings(&created["permissions"]),
            sorted(permissions),
            "{role}"
        );
        assert!(created.get("explicitPermissions").is_none(), "{created}");
        let me = client.get("/v1/whoami").expect_status(200).json();
        assert_eq!(strings(&me["permissions"]), sorted(permissions), "{role}");
        assert_eq!(me["orgId"], "acme");
        assert_eq!(me["operator"], false);
    }
    app.operator()
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "x", "role": "owner" }),
        )
        .expect_problem(422, "invalid-field");
}

#[test]
fn explicit_permissions_narrow_a_role_and_never_widen_it() {
    let app = App::start();
    app.org("acme");
    app.node("n1", "acme", &["u1"]);
    let operator = app.operator();

    let (created, narrowed) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "vm reader", "role": "member", "permissions": ["vm.read"] }),
    );
    assert_eq!(strings(&created["permissions"]), ["vm.read"]);
    assert_eq!(strings(&created["explicitPermissions"]), ["vm.read"]);
    let me = narrowed.get("/v1/whoami").expect_status(200).json();
    assert_eq!(strings(&me["permissions"]), ["vm.read"]);
    narrowed.get("/v1/vms").expect_status(200);
    narrowed.get("/v1/nodes").expect_problem(403, "forbidden");
    narrowed
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(403, "forbidden");

    // An empty list is a key that can do nothing but say who it is.
    let (created, empty) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "nothing", "role": "admin", "permissions": [] }),
    );
    assert_eq!(created["permissions"], json!([]));
    assert_eq!(created["explicitPermissions"], json!([]));
    empty.get("/v1/whoami").expect_status(200);
    empty.get("/v1/nodes/n1").expect_problem(403, "forbidden");
    empty
        .get("/v1/orgs/acme/keys")
        .expect_problem(403, "forbidden");

    // Widening beyond the role, unknown names and repeats are refused.
    for (role, list) in [
        ("viewer", json!(["vm.write"])),
        ("member", json!(["vm.read", "reservation.capacity"])),
        ("capacity-manager", json!(["apikey.manage"])),
        ("admin", json!(["node.read", "root"])),
        ("admin", json!(["node.read", "node.read"])),
        ("admin", json!(["Node.Read"])),
    ] {
        let problem = operator
            .post(
                "/v1/orgs/acme/keys",
                &json!({ "name": "wide", "role": role, "permissions": list }),
            )
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "permissions", "{role} {list}: {problem}");
    }
    operator
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "wide", "role": "admin", "permissions": "node.read" }),
        )
        .expect_status(400);
    let listed = operator.get("/v1/orgs/acme/keys").expect_status(200).json();
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        2,
        "no refused key was stored"
    );
}

#[test]
fn key_requests_are_validated() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    for (body, status, code, field) in [
        (
            json!({ "name": "k", "role": "root" }),
            422,
            "invalid-field",
            Some("role"),
        ),
        (
            json!({ "name": "", "role": "viewer" }),
            422,
            "invalid-field",
            Some("name"),
        ),
        (
            json!({ "name": "a\nb", "role": "viewer" }),
            422,
            "invalid-field",
            Some("name"),
        ),
        (
            json!({ "role": "viewer" }),
            400,
            "missing-field",
            Some("name"),
        ),
        (
            json!({ "name": "k", "role": "viewer", "org": "acme" }),
            400,
            "unknown-field",
            None,
        ),
        (
            json!({ "name": "k", "role": "viewer", "token": "mine" }),
            400,
            "unknown-field",
            None,
        ),
    ] {
        let problem = operator
            .post("/v1/orgs/acme/keys", &body)
            .expect_problem(status, code);
        if let Some(field) = field {
            assert_eq!(problem["field"], field, "{body}");
        }
    }
    operator
        .send(
            "POST",
            "/v1/orgs/acme/keys",
            Some("text/plain"),
            Some(br#"{"name":"k","role":"viewer"}"#),
        )
        .expect_problem(415, "unsupported-media-type");
    // A key for an org that does not exist.
    operator
        .post(
            "/v1/orgs/ghost/keys",
            &json!({ "name": "k", "role": "viewer" }),
        )
        .expect_problem(404, "not-found");
    operator
        .get("/v1/orgs/ghost/keys")
        .expect_problem(404, "not-found");
}

#[test]
fn keys_are_listed_oldest_first_with_a_cursor() {
    let app = App::start();
    app.org("acme");
    app.org("other");
    app.key("other", "admin", None);
    let operator = app.operator();
    let mut created = Vec::new();
    for i in 0..7 {
        let key = operator
            .post(
                "/v1/orgs/acme/keys",
                &json!({ "name": format!("key {i}"), "role": "viewer" }),
            )
            .expect_status(201)
            .json();
        created.push(key["id"].as_str().unwrap().to_owned());
    }
    let mut seen = Vec::new();
    let mut path = "/v1/orgs/acme/keys?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = operator.get(&path).expect_status(200).json();
        pages += 1;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        for item in items {
            assert_eq!(item["orgId"], "acme");
            assert!(item.get("token").is_none());
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/v1/orgs/acme/keys?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen, created,
        "every key once, oldest first, none of another org"
    );
    let all = operator.get("/v1/orgs/acme/keys").expect_status(200).json();
    assert!(all.get("nextCursor").is_none());
    assert_eq!(all["items"].as_array().unwrap().len(), 7);

    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "limit=1&limit=2",
        "page=2",
    ] {
        let reply = operator.get(&format!("/v1/orgs/acme/keys?{bad}"));
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text());
    }
}

#[test]
fn a_revoked_key_is_refused_on_its_next_request() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    let (created, client) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "leaked", "role": "admin" }),
    );
    let key_id = created["id"].as_str().unwrap();
    client.get("/v1/whoami").expect_status(200);
    client.get("/v1/orgs/acme/keys").expect_status(200);

    let revoked = operator
        .delete(&format!("/v1/orgs/acme/keys/{key_id}"))
        .expect_status(200)
        .json();
    assert_eq!(revoked["id"], key_id);
    assert_eq!(revoked["status"], "revoked");
    assert!(revoked["revokedAt"].is_string());
    for path in [
        "/v1/whoami",
        "/v1/orgs/acme",
        "/v1/orgs/acme/keys",
        "/v1/nodes",
    ] {
        let problem = expect_unauthorized(client.get(path));
        assert_eq!(problem["detail"], "the token is unknown or revoked");
    }
    // Revoking again changes nothing.
    let again = operator
        .delete(&format!("/v1/orgs/acme/keys/{key_id}"))
        .expect_status(200)
        .json();
    assert_eq!(again, revoked);
    let listed = operator.get("/v1/orgs/acme/keys").expect_status(200).json();
    assert_eq!(listed["items"][0]["status"], "revoked");
    assert_eq!(listed["items"][0]["revokedAt"], revoked["revokedAt"]);

    // An admin key may revoke a key of its own org, including itself.
    let (admin, admin_client) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "a", "role": "admin" }),
    );
    let (viewer, viewer_client) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "v", "role": "viewer" }),
    );
    admin_client
        .delete(&format!(
            "/v1/orgs/acme/keys/{}",
            viewer["id"].as_str().unwrap()
        ))
        .expect_status(200);
    expect_unauthorized(viewer_client.get("/v1/whoami"));
    admin_client
        .delete(&format!(
            "/v1/orgs/acme/keys/{}",
            admin["id"].as_str().unwrap()
        ))
        .expect_status(200);
    expect_unauthorized(admin_client.get("/v1/whoami"));

    operator
        .delete("/v1/orgs/acme/keys/key-0000000000000000")
        .expect_problem(404, "not-found");
    let db_revoked: i64 = app
        .db()
        .query_row(
            "SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(db_revoked, 3);
}

#[test]
fn org_keys_manage_their_own_org_only() {
    let app = App::start();
    app.org("acme");
    app.org("other");
    let operator = app.operator();
    let (acme_viewer, _) = create_key(
        &app,
        &operator,
        "acme",
        json!({ "name": "v", "role": "viewer" }),
    );
    let acme_viewer_id = acme_viewer["id"].as_str().unwrap();
    let revoke_path = format!("/v1/orgs/acme/keys/{acme_viewer_id}");
    let new_key = json!({ "name": "n", "role": "viewer" });

    // Another org's admin cannot even learn that acme exists.
    let other_admin = app.key("other", "admin", None);
    other_admin
        .get("/v1/orgs/acme")
        .expect_problem(404, "not-found");
    other_admin
        .get("/v1/orgs/acme/keys")
        .expect_problem(404, "not-found");
    other_admin
        .post("/v1/orgs/acme/keys", &new_key)
        .expect_problem(404, "not-found");
    other_admin
        .delete(&revoke_path)
        .expect_problem(404, "not-found");
    other_admin
        .get("/v1/orgs/ghost/keys")
        .expect_problem(404, "not-found");
    // Nor revoke an acme key through its own org's path.
    other_admin
        .delete(&format!("/v1/orgs/other/keys/{acme_viewer_id}"))
        .expect_problem(404, "not-found");
    operator
        .delete(&format!("/v1/orgs/other/keys/{acme_viewer_id}"))
        .expect_problem(404, "not-found");

    // Inside the org, apikey.manage decides.
    for role in ["capacity-manager", "member", "viewer"] {
        let key = app.key("acme", role, None);
        key.get("/v1/orgs/acme").expect_status(200);
        key.get("/v1/orgs/acme/keys")
            .expect_problem(403, "forbidden");
        key.post("/v1/orgs/acme/keys", &new_key)
            .expect_problem(403, "forbidden");
        key.delete(&revoke_path).expect_problem(403, "forbidden");
    }
    let admin = app.key("acme", "admin", None);
    let minted = admin
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "minted", "role": "admin" }),
        )
        .expect_status(201)
        .json();
    assert_eq!(minted["createdBy"], admin.token().map(key_id_of).unwrap());
    app.client(minted["token"].as_str().unwrap())
        .get("/v1/whoami")
        .expect_status(200);
    admin.get("/v1/orgs/acme/keys").expect_status(200);

    // A key narrowed to apikey.manage manages keys, but mints none holding more than it holds.
    let manager_only = app.key("acme", "admin", Some(&["apikey.manage"]));
    manager_only.get("/v1/orgs/acme/keys").expect_status(200);
    manager_only
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "escalate", "role": "admin" }),
        )
        .expect_problem(403, "forbidden");
    manager_only
        .post("/v1/orgs/acme/keys", &new_key)
        .expect_problem(403, "forbidden");
    manager_only
        .post(
            "/v1/orgs/acme/keys",
            &json!({ "name": "same", "role": "admin", "permissions": ["apikey.manage"] }),
        )
        .expect_status(201);
    let reader_manager = app.key(
        "acme",
        "admin",
        Some(&["apikey.manage", "node.read", "reservation.read", "vm.read"]),
    );
    reader_manager
        .post("/v1/orgs/acme/keys", &new_key)
        .expect_status(201);
    // Revoking follows the same rule (a narrowed key could otherwise lock out a stronger
    // one): the viewer key holds permissions that apikey.manage alone lacks.
    manager_only
        .delete(&revoke_path)
        .expect_problem(403, "forbidden");
    reader_manager.delete(&revoke_path).expect_status(200);
}

/// An org holds a bounded number of live keys, so no org can mint keys to crowd the others
/// out of what each key may hold; a revoked key frees its slot.
#[test]
fn an_org_holds_at_most_its_bound_of_live_keys() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    let body = json!({ "name": "one of many", "role": "viewer" });
    let created: Vec<Value> = (0..reservations_store::keys::LIVE_KEYS_PER_ORG)
        .map(|_| {
            operator
                .post("/v1/orgs/acme/keys", &body)
                .expect_status(201)
                .json()
        })
        .collect();
    let refused = operator
        .post("/v1/orgs/acme/keys", &body)
        .expect_problem(409, "too-many-keys");
    assert_eq!(
        refused["limit"],
        reservations_store::keys::LIVE_KEYS_PER_ORG
    );
    // Another org is not held back.
    app.org("other");
    operator
        .post("/v1/orgs/other/keys", &body)
        .expect_status(201);
    let revoked = created[0]["id"].as_str().expect("an id");
    operator
        .delete(&format!("/v1/orgs/acme/keys/{revoked}"))
        .expect_status(200);
    operator
        .post("/v1/orgs/acme/keys", &body)
        .expect_status(201);
    operator
        .post("/v1/orgs/acme/keys", &body)
        .expect_problem(409, "too-many-keys");
}
