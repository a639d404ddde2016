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

mod responses;

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
