//! The OpenAPI document (`docs/openapi.json`, served at `/v1/openapi.json`) against the app:
//! it documents exactly the (method, route) pairs the app serves, and a realistic scenario's
//! every real response — successes and every kind of error — has a documented status, the
//! documented content type and headers, and a body that validates against the documented
//! schema (OpenAPI 3.1 schemas are JSON Schema 2020-12). Undocumented statuses fail.

use std::collections::BTreeSet;
use std::sync::Arc;

use api_client::Contract;
use api_client::contract::resolve;

use serde_json::{Value, json};

use crate::routes::{api_routes, public_api_routes};
use api_support::{App, Client, METHODS, OPERATOR_TOKEN, rfc3339_from_now, workspace};

fn repo_document() -> Value {
    let text =
        std::fs::read_to_string(workspace().join("docs/openapi.json")).expect("docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

/// `/v1/nodes/{nodeId}` → `/v1/nodes/:nodeId`, as spin.toml and the route table write routes.
fn to_spin_route(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment.strip_prefix('{') {
            Some(name) => format!(":{}", name.trim_end_matches('}')),
            None => segment.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `(METHOD, route)` pairs the document describes.
fn documented_routes(document: &Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                routes.insert((method.to_ascii_uppercase(), to_spin_route(path)));
            }
        }
    }
    routes
}

/// Every `$ref` string anywhere in `value`.
fn references(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, member) in map {
                match (key.as_str(), member) {
                    ("$ref", Value::String(reference)) => found.push(reference.clone()),
                    _ => references(member, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

/// The document, and what a scenario has checked against it (every client checks the
/// operations it knows; a scenario's callers also fail on any operation it does not).
struct Spec {
    contract: Arc<Contract>,
    document: Value,
}

impl Spec {
    fn new(document: Value) -> Spec {
        Spec {
            contract: Arc::new(Contract::new(document.clone())),
            document,
        }
    }

    #[track_caller]
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        if let Err(violation) = self.contract.validate(schema, instance, what) {
            panic!("{violation}");
        }
    }

    fn seen(&self) -> BTreeSet<(String, String, u16)> {
        self.contract.seen()
    }

    fn documented_responses(&self) -> BTreeSet<(String, String, u16)> {
        self.contract.documented_responses()
    }

    /// A caller whose every response is checked against the document, and which fails on
    /// an operation the document does not describe.
    fn caller(&self, client: Client) -> Client {
        client.with_strict_contract(self.contract.clone())
    }
}

#[test]
fn the_document_describes_exactly_the_served_routes() {
    let document = repo_document();
    assert_eq!(document["openapi"].as_str().map(|v| &v[..4]), Some("3.1."));
    // The JSON API; the console's HTML page is no operation of it.
    let served = api_routes();
    let documented = documented_routes(&document);
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let not_served: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && not_served.is_empty(),
        "served but not documented: {undocumented:?}\ndocumented but not served: {not_served:?}"
    );
    assert!(served.len() >= 24, "parsed too few routes: {served:?}");
}

/// The operations the document marks `security: []` are the table's public routes.
#[test]
fn the_document_leaves_unsecured_exactly_the_public_routes() {
    let document = repo_document();
    let mut unsecured = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item
                .get(method)
                .is_some_and(|op| op.get("security") == Some(&json!([])))
            {
                unsecured.insert((method.to_ascii_uppercase(), to_spin_route(path)));
            }
        }
    }
    assert_eq!(unsecured, public_api_routes());
}

#[test]
fn the_document_is_well_formed() {
    let document = repo_document();
    let mut operation_ids = BTreeSet::new();
    for (template, item) in document["paths"].as_object().expect("paths") {
        let template_params: BTreeSet<String> = template
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}').map(str::to_owned))
            .collect();
        for method in METHODS {
            let Some(operation) = item.get(method) else {
                continue;
            };
            let what = format!("{method} {template}");
            let id = operation["operationId"].as_str().expect("operationId");
            assert!(
                operation_ids.insert(id.to_owned()),
                "{what}: operationId {id} repeats"
            );
            let parameters: Vec<&Value> = operation["parameters"]
                .as_array()
                .map(|list| list.iter().map(|p| resolve(&document, p)).collect())
                .unwrap_or_default();
            let path_params: BTreeSet<String> = parameters
                .iter()
                .filter(|p| p["in"] == "path")
                .map(|p| {
                    assert_eq!(p["required"], true, "{what}: path parameters are required");
                    p["name"].as_str().expect("name").to_owned()
                })
                .collect();
            assert_eq!(path_params, template_params, "{what}: path parameters");
            let statuses: Vec<&String> = operation["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .collect();
            assert!(
                statuses.iter().any(|s| s.starts_with('2')),
                "{what}: no success response"
            );
            let secured = operation.get("security") != Some(&json!([]));
            if secured {
                for status in ["400", "401"] {
                    assert!(
                        operation["responses"].get(status).is_some(),
                        "{what}: an authenticated operation documents {status}"
                    );
                }
            }
            if method == "post" || method == "put" {
                let body =
                    operation["requestBody"]["content"]["application/json"]["schema"].clone();
                let body = resolve(&document, &body);
                assert_eq!(
                    body["additionalProperties"], false,
                    "{what}: request bodies refuse unknown members"
                );
                for status in ["413", "415"] {
                    assert!(
                        operation["responses"].get(status).is_some(),
                        "{what}: a body-taking operation documents {status}"
                    );
                }
            }
        }
    }
    let mut found = Vec::new();
    references(&document, &mut found);
    for reference in found {
        let pointer = reference.strip_prefix('#').expect("local reference");
        assert!(
            document.pointer(pointer).is_some(),
            "dangling reference {reference}"
        );
    }
    // Every schema compiles as JSON Schema 2020-12.
    for name in document["components"]["schemas"]
        .as_object()
        .expect("schemas")
        .keys()
    {
        let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
        let mut root = schema.clone();
        root["components"] = document["components"].clone();
        jsonschema::options()
            .build(&root)
            .unwrap_or_else(|e| panic!("schema {name} does not compile: {e}"));
    }
}

/// Every `examples` entry of a request body or a response validates against the schema it
/// illustrates, and the main operations have them: an example the app would refuse, or
/// never send, would teach the wrong contract.
#[test]
fn every_example_validates_against_its_schema() {
    let spec = Spec::new(repo_document());
    let mut illustrated = BTreeSet::new();
    let mut checked = 0;
    for (template, item) in spec.document["paths"].as_object().expect("paths") {
        for method in METHODS {
            let Some(operation) = item.get(method) else {
                continue;
            };
            let mut media_types = Vec::new();
            if let Some(body) = operation.get("requestBody") {
                let body = resolve(&spec.document, body);
                for (content_type, media) in body["content"].as_object().expect("content") {
                    media_types.push((format!("request {content_type}"), media.clone()));
                }
            }
            for (status, response) in operation["responses"].as_object().expect("responses") {
                let response = resolve(&spec.document, response);
                if let Some(content) = response.get("content").and_then(Value::as_object) {
                    for (content_type, media) in content {
                        media_types.push((format!("{status} {content_type}"), media.clone()));
                    }
                }
            }
            for (which, media) in media_types {
                assert!(
                    media.get("example").is_none(),
                    "{method} {template} {which}: use `examples` (named), not `example`"
                );
                let Some(examples) = media.get("examples").and_then(Value::as_object) else {
                    continue;
                };
                for (name, example) in examples {
                    let example = resolve(&spec.document, example);
                    let value = example
                        .get("value")
                        .unwrap_or_else(|| panic!("{method} {template} {which} {name}: no value"));
                    spec.validate(
                        &media["schema"],
                        value,
                        &format!("{method} {template} {which}: example {name}"),
                    );
                    checked += 1;
                    let side = if which.starts_with("request") {
                        "request"
                    } else {
                        "response"
                    };
                    illustrated.insert((method.to_ascii_uppercase(), template.clone(), side));
                }
            }
        }
    }
    let main_operations: &[(&str, &str, &[&str])] = &[
        ("POST", "/v1/orgs", &["request", "response"]),
        ("POST", "/v1/orgs/{orgId}/keys", &["request", "response"]),
        ("PUT", "/v1/nodes/{nodeId}", &["request", "response"]),
        (
            "POST",
            "/v1/nodes/{nodeId}/reservations",
            &["request", "response"],
        ),
        (
            "POST",
            "/v1/nodes/{nodeId}/reservations/{id}/release",
            &["request", "response"],
        ),
        (
            "POST",
            "/v1/nodes/{nodeId}/reservations/{id}/reclaim",
            &["request", "response"],
        ),
        (
            "POST",
            "/v1/nodes/{nodeId}/reservations/{id}/reclaim/dry-run",
            &["request", "response"],
        ),
        ("POST", "/v1/vms", &["request", "response"]),
        ("GET", "/v1/market", &["response"]),
    ];
    for (method, template, sides) in main_operations {
        for side in *sides {
            assert!(
                illustrated.contains(&(method.to_string(), template.to_string(), *side)),
                "{method} {template}: no {side} example"
            );
        }
    }
    assert!(checked >= 20, "too few examples checked: {checked}");
}

/// The descriptions a newcomer needs and the servers a client can use.
#[test]
fn the_document_answers_a_newcomers_questions() {
    let document = repo_document();
    let schemas = &document["components"]["schemas"];
    let text = |pointer: &str| {
        document
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no description at {pointer}"))
            .to_owned()
    };
    let starts = text("/components/schemas/NewReservation/properties/startsAt/description");
    assert!(
        starts.contains("past") && starts.contains("spot"),
        "{starts}"
    );
    assert_eq!(
        schemas["ReservationFields"]["properties"]["startsAt"]["description"],
        schemas["NewReservation"]["properties"]["startsAt"]["description"]
    );
    let reclaim =
        text("/paths/~1v1~1nodes~1{nodeId}~1reservations~1{id}~1reclaim/post/description");
    assert!(
        reclaim.contains("not released") && reclaim.contains("skipped"),
        "{reclaim}"
    );
    let reason = text("/components/schemas/ReservationFields/properties/reason/description");
    assert!(reason.contains("audit trail"), "{reason}");
    let servers = document["servers"].as_array().expect("servers");
    assert!(
        servers
            .iter()
            .any(|s| s["url"].as_str().is_some_and(|u| u.starts_with("https://"))),
        "a real-looking server: {servers:?}"
    );
    assert!(
        servers.iter().any(|s| s["url"] == "http://127.0.0.1:3000"),
        "the local server: {servers:?}"
    );
}

#[test]
fn undeclared_methods_get_405_listing_the_documented_ones() {
    let app = App::start();
    let document = repo_document();
    let operator = app.operator();
    for (template, item) in document["paths"].as_object().expect("paths") {
        let path = template
            .split('/')
            .map(|s| if s.starts_with('{') { "x1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let mut documented: Vec<String> = METHODS
            .iter()
            .filter(|m| item.get(**m).is_some())
            .map(|m| m.to_ascii_uppercase())
            .collect();
        if documented.iter().any(|m| m == "GET") {
            documented.push("HEAD".to_owned());
        }
        documented.sort();
        let reply = operator.send("PATCH", &path, Some("application/json"), Some(b"{}"));
        let allow = reply.header("allow").map(str::to_owned);
        reply.expect_problem(405, "method-not-allowed");
        let mut allowed: Vec<String> = allow
            .unwrap_or_else(|| panic!("PATCH {path}: 405 without Allow"))
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
        allowed.sort();
        assert_eq!(allowed, documented, "Allow of {template}");
    }
}

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
