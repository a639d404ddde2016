//! Identity and access over HTTP: orgs, API keys (issued once, stored as a hash, listed,
//! revoked), roles and explicit permission lists, the bearer syntax, `/v1/whoami`, and the
//! bootstrap operator credential.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use spin_host::{Host, HostConfig};

use api_support::{App, Client, OPERATOR_TOKEN, Reply, TempDir, sorted, strings, workspace};

/// The role table the README documents.
const ROLE_PERMISSIONS: [(&str, &[&str]); 4] = [
    (
        "admin",
        &[
            "apikey.manage",
            "audit.read",
            "node.read",
            "node.write",
            "reservation.capacity",
            "reservation.read",
            "reservation.write",
            "vm.read",
            "vm.write",
        ],
    ),
    (
        "capacity-manager",
        &[
            "audit.read",
            "node.read",
            "node.write",
            "reservation.capacity",
            "reservation.read",
            "reservation.write",
            "vm.read",
        ],
    ),
    (
        "member",
        &["node.read", "reservation.read", "vm.read", "vm.write"],
    ),
    ("viewer", &["node.read", "reservation.read", "vm.read"]),
];

/// A key created by `creator`: the creation response (with the token) and a client using it.
fn create_key(app: &App, creator: &Client, org: &str, body: Value) -> (Value, Client) {
    let created = creator
        .post(&format!("/v1/orgs/{org}/keys"), &body)
        .expect_status(201)
        .json();
    let client = app.client(created["token"].as_str().expect("the token is returned"));
    (created, client)
}

/// Org `acme` and a viewer key of it: the key as created, and its token.
fn acme_viewer_key(app: &App) -> (Value, String) {
    app.org("acme");
    let (created, _) = create_key(
        app,
        &app.operator(),
        "acme",
        json!({ "name": "k", "role": "viewer" }),
    );
    let token = created["token"].as_str().unwrap().to_owned();
    (created, token)
}

/// Asserts a 401 problem carrying a Bearer challenge.
#[track_caller]
fn expect_unauthorized(reply: Reply) -> Value {
    let challenge = reply.header("www-authenticate").map(str::to_owned);
    let problem = reply.expect_problem(401, "unauthorized");
    let challenge = challenge.expect("a 401 carries WWW-Authenticate");
    assert!(
        challenge.starts_with("Bearer ") || challenge == "Bearer",
        "challenge: {challenge}"
    );
    problem
}

fn key_id_of(token: &str) -> &str {
    token.split('.').nth(1).expect("gpr.<key id>.<secret>")
}

/// The README's "Roles and permissions" table says what the app grants.
#[test]
fn the_readme_documents_each_roles_permissions() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let section = readme
        .split("### Roles and permissions")
        .nth(1)
        .expect("a Roles and permissions section");
    // The first table of the section, and only it.
    let mut lines = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'));
    let header: Vec<&str> = lines
        .next()
        .expect("a table")
        .split('|')
        .map(str::trim)
        .collect();
    let mut documented: Vec<(String, Vec<String>)> = ROLE_PERMISSIONS
        .iter()
        .map(|(role, _)| {
            assert!(header.contains(role), "no column for {role}: {header:?}");
            ((*role).to_owned(), Vec::new())
        })
        .collect();
    let mut rows = 0;
    for line in lines.skip(1) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let permission = cells[1].trim_matches('`');
        rows += 1;
        for (role, granted) in &mut documented {
            let column = header.iter().position(|h| h == role).unwrap();
            match cells[column] {
                "✓" => granted.push(permission.to_owned()),
                "" => {}
                other => panic!("{permission} for {role}: {other:?}"),
            }
        }
    }
    assert_eq!(rows, 9, "one row per permission");
    for ((role, granted), (_, permissions)) in documented.iter_mut().zip(ROLE_PERMISSIONS) {
        granted.sort();
        assert_eq!(granted, &sorted(permissions), "{role}");
    }
}

#[test]
fn operator_creates_orgs_and_org_keys_cannot() {
    let app = App::start();
    let operator = app.operator();
    let reply = operator
        .post("/v1/orgs", &json!({ "id": "acme", "name": "Acme GPUs" }))
        .expect_status(201);
    assert_eq!(reply.header("location"), Some("/v1/orgs/acme"));
    let org = reply.json();
    assert_eq!(org["id"], "acme");
    assert_eq!(org["name"], "Acme GPUs");
    assert!(org["createdAt"].as_str().unwrap().ends_with('Z'), "{org}");
    assert_eq!(operator.get("/v1/orgs/acme").expect_status(200).json(), org);

    // Without an id, one is generated.
    let generated = operator
        .post("/v1/orgs", &json!({ "name": "Nameless" }))
        .expect_status(201)
        .json();
    let id = generated["id"].as_str().unwrap();
    assert!(id.starts_with("org-") && id.len() > 4, "{generated}");
    operator.get(&format!("/v1/orgs/{id}")).expect_status(200);

    for role in ["admin", "capacity-manager", "member", "viewer"] {
        let key = app.key("acme", role, None);
        key.post("/v1/orgs", &json!({ "id": "mine", "name": "Mine" }))
            .expect_problem(403, "forbidden");
    }
    expect_unauthorized(
        app.anonymous()
            .post("/v1/orgs", &json!({ "id": "anon", "name": "Anon" })),
    );
    operator
        .get("/v1/orgs/mine")
        .expect_problem(404, "not-found");
    operator
        .get("/v1/orgs/anon")
        .expect_problem(404, "not-found");
}

#[test]
fn org_ids_are_validated_and_unique() {
    let app = App::start();
    let operator = app.operator();
    operator
        .post("/v1/orgs", &json!({ "id": "acme", "name": "Acme" }))
        .expect_status(201);
    let duplicate = operator
        .post("/v1/orgs", &json!({ "id": "acme", "name": "Another Acme" }))
        .expect_problem(409, "already-exists");
    assert_eq!(duplicate["id"], "acme");
    assert_eq!(
        operator.get("/v1/orgs/acme").expect_status(200).json()["name"],
        "Acme",
        "the first org is untouched"
    );

    let too_long = "a".repeat(129);
    for bad in [
        "",
        "-acme",
        ".acme",
        "ac me",
        "acme/x",
        "acmé",
        too_long.as_str(),
    ] {
        let problem = operator
            .post("/v1/orgs", &json!({ "id": bad, "name": "Bad" }))
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "id", "{bad:?}: {problem}");
    }
    for ok in ["a", "Acme_2:eu-west.1", "a".repeat(128).as_str()] {
        operator
            .post("/v1/orgs", &json!({ "id": ok, "name": "Fine" }))
            .expect_status(201);
    }
    for bad_name in [json!(""), json!("a\u{7}b"), json!("x".repeat(201))] {
        let problem = operator
            .post("/v1/orgs", &json!({ "id": "named", "name": bad_name }))
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "name");
    }
    operator
        .post(
            "/v1/orgs",
            &json!({ "id": "extra", "name": "X", "plan": "gold" }),
        )
        .expect_problem(400, "unknown-field");
    operator
        .post("/v1/orgs", &json!({ "id": "nameless" }))
        .expect_status(400);
    operator
        .get("/v1/orgs/extra")
        .expect_problem(404, "not-found");
}

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

/// Header values that are not `Bearer <token>`, each refused with the same 401.
#[test]
fn malformed_authorization_headers_are_refused_with_a_bearer_challenge() {
    let app = App::start();
    let (_, token) = acme_viewer_key(&app);
    let (head, tail) = token.split_at(20);
    let anonymous = app.anonymous();

    let problem = expect_unauthorized(anonymous.get("/v1/whoami"));
    assert_eq!(problem["instance"], "/v1/whoami");
    for header in [
        format!("Basic {token}"),
        format!("Token {token}"),
        token.clone(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Bearer  {token}"),
        format!("Bearer\t{token}"),
        format!("Bearer {token} junk"),
        format!("Bearer {token},Bearer {token}"),
        format!("Bearer {head} {tail}"),
        format!("Bearer {head}\t{tail}"),
        format!("Bearer \"{token}\""),
        format!("Bearer {token}!"),
        format!("Bearer {}", OPERATOR_TOKEN.replace('-', " ")),
    ] {
        let reply = anonymous.with_authorization(&header).get("/v1/whoami");
        assert_eq!(reply.status, 401, "{header:?} was accepted");
        expect_unauthorized(reply);
    }
    // The scheme is case-insensitive (RFC 7235).
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let me = anonymous
            .with_authorization(&format!("{scheme} {token}"))
            .get("/v1/whoami")
            .expect_status(200)
            .json();
        assert_eq!(me["orgId"], "acme", "{scheme}");
    }
}

#[test]
fn unknown_tokens_are_refused_alike() {
    let app = App::start();
    let (created, token) = acme_viewer_key(&app);
    let key_id = created["id"].as_str().unwrap();
    let secret = token.rsplit('.').next().unwrap();
    let mut flipped = secret.to_owned().into_bytes();
    flipped[10] = if flipped[10] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).unwrap();
    let mut details = BTreeSet::new();
    for unknown in [
        "nonsense".to_owned(),
        format!("gpr.{key_id}.{flipped}"),
        format!("gpr.{key_id}.{}", &secret[..63]),
        format!("gpr.{key_id}.{secret}0"),
        format!("gpr.key-0000000000000000.{secret}"),
        format!("gpx.{key_id}.{secret}"),
        format!("gpr.{key_id}"),
        format!("{OPERATOR_TOKEN}x"),
        OPERATOR_TOKEN[1..].to_owned(),
        secret.to_owned(),
    ] {
        let problem = expect_unauthorized(app.client(&unknown).get("/v1/whoami"));
        details.insert(problem["detail"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        details.len(),
        1,
        "every unknown token gets the same answer: {details:?}"
    );
    app.client(&token).get("/v1/whoami").expect_status(200);
}

#[test]
fn whoami_describes_the_caller() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator().get("/v1/whoami").expect_status(200).json();
    assert_eq!(operator["operator"], true);
    assert_eq!(operator["orgId"], Value::Null);
    assert_eq!(operator["keyId"], "operator");
    // Everything but vm.write: the operator places no VMs (it has no org to run them for).
    let mut usable: Vec<&str> = ROLE_PERMISSIONS[0].1.to_vec();
    usable.retain(|p| *p != "vm.write");
    assert_eq!(strings(&operator["permissions"]), sorted(&usable));
    app.operator()
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(403, "forbidden");

    let (created, key) = create_key(
        &app,
        &app.operator(),
        "acme",
        json!({ "name": "k", "role": "capacity-manager", "permissions": ["node.read", "audit.read"] }),
    );
    let me = key.get("/v1/whoami").expect_status(200).json();
    assert_eq!(me["keyId"], created["id"]);
    assert_eq!(me["orgId"], "acme");
    assert_eq!(me["operator"], false);
    assert_eq!(strings(&me["permissions"]), ["audit.read", "node.read"]);
    assert_eq!(me.as_object().unwrap().len(), 4, "{me}");
    let reply = key.get("/v1/whoami");
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    expect_unauthorized(app.anonymous().get("/v1/whoami"));
}

#[test]
fn an_empty_operator_token_refuses_authenticated_routes_and_health_is_not_ready() {
    for unset in ["", "   "] {
        let app = App::start_with(|c| c.env("SPIN_VARIABLE_OPERATOR_TOKEN", unset));
        // Health says the app is not ready, with the same problem the other routes answer.
        let health = app
            .anonymous()
            .get("/v1/healthz")
            .expect_problem(503, "operator-token-unset");
        assert!(
            health["detail"]
                .as_str()
                .unwrap()
                .contains("SPIN_VARIABLE_OPERATOR_TOKEN"),
            "{health}"
        );
        app.anonymous().get("/v1/openapi.json").expect_status(200);
        for client in [
            app.anonymous(),
            app.client("anything"),
            app.anonymous()
                .with_authorization(&format!("Bearer {unset}")),
        ] {
            for (method, path) in [
                ("GET", "/v1/whoami"),
                ("POST", "/v1/orgs"),
                ("GET", "/v1/nodes"),
                ("GET", "/v1/vms"),
                ("GET", "/v1/audit"),
                ("POST", "/v1/nodes/n1/reservations/r1/release"),
            ] {
                let reply = client.send(method, path, Some("application/json"), Some(b"{}"));
                let problem = reply.expect_problem(503, "operator-token-unset");
                assert!(
                    problem["detail"]
                        .as_str()
                        .unwrap()
                        .contains("SPIN_VARIABLE_OPERATOR_TOKEN"),
                    "{problem}"
                );
            }
        }
    }
}

#[test]
fn without_the_operator_token_variable_the_host_refuses_to_start() {
    api_support::ensure_components_built();
    let state = TempDir::new("no-operator-token");
    let config = HostConfig::new(workspace().join("spin.toml")).state_dir(state.path());
    let error = match Host::start(config) {
        Ok(_) => panic!("the app started without an operator credential"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("operator_token"), "{error}");
    assert!(error.contains("SPIN_VARIABLE_OPERATOR_TOKEN"), "{error}");
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
