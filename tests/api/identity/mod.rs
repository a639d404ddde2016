//! Identity and access over HTTP: orgs, API keys (issued once, stored as a hash, listed,
//! revoked), roles and explicit permission lists, the bearer syntax, `/v1/whoami`, and the
//! bootstrap operator credential.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use spin_host::{Host, HostConfig};

use api_support::{App, Client, OPERATOR_TOKEN, Reply, TempDir, sorted, strings, workspace};

mod operator_keys;
mod org_keys;
mod tokens;

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
