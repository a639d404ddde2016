//! The contract (`docs/openapi.json`) as the suites read it.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::Value;

/// The OpenAPI document the app serves, read once per test process.
pub fn openapi() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let path = crate::workspace().join("docs/openapi.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        serde_json::from_str(&text).expect("docs/openapi.json is JSON")
    })
}

/// The fields the contract allows, and requires, in an audit event shown as `view` (the
/// partial views of a key without `audit.read`).
pub fn event_view_fields(view: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let schema = match view {
        "summary" => "AuditEventSummary",
        "own-vms" => "AuditEventOwnVms",
        other => panic!("a view the contract has no schema for: {other}"),
    };
    let schema = &openapi()["components"]["schemas"][schema];
    assert_eq!(schema["additionalProperties"], false, "{schema}");
    let names = |value: &Value| -> BTreeSet<String> {
        match value {
            Value::Object(map) => map.keys().cloned().collect(),
            Value::Array(list) => list
                .iter()
                .map(|v| v.as_str().expect("a name").to_owned())
                .collect(),
            other => panic!("not a list of fields: {other}"),
        }
    };
    (names(&schema["properties"]), names(&schema["required"]))
}

/// The actions an audit event may record, as the contract lists them.
pub fn audit_actions() -> Vec<String> {
    openapi()["components"]["schemas"]["AuditAction"]["enum"]
        .as_array()
        .expect("AuditAction is an enum")
        .iter()
        .map(|action| action.as_str().expect("an action").to_owned())
        .collect()
}

/// The fields of an audit event the contract shows to operators only (their descriptions
/// begin "Operators only"): who else sees the event, and its places in its chain.
pub fn operators_only_event_fields() -> BTreeSet<String> {
    openapi()["components"]["schemas"]["AuditEvent"]["properties"]
        .as_object()
        .expect("AuditEvent has properties")
        .iter()
        .filter(|(_, schema)| {
            schema["description"]
                .as_str()
                .is_some_and(|text| text.starts_with("Operators only"))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The names of an event's fields.
pub fn fields_of(event: &Value) -> BTreeSet<String> {
    event
        .as_object()
        .unwrap_or_else(|| panic!("not an event: {event}"))
        .keys()
        .cloned()
        .collect()
}

/// `event` is shown in a partial view, with exactly the fields the contract allows for it:
/// none beyond them, none of the required ones missing.
#[track_caller]
pub fn assert_event_fits_its_view(who: &str, event: &Value) {
    let view = event["view"]
        .as_str()
        .unwrap_or_else(|| panic!("{who}: an event shown whole: {event}"));
    let (allowed, required) = event_view_fields(view);
    let fields = fields_of(event);
    let beyond: Vec<_> = fields.difference(&allowed).collect();
    assert!(beyond.is_empty(), "{who}: fields {beyond:?} in {event}");
    let missing: Vec<_> = required.difference(&fields).collect();
    assert!(missing.is_empty(), "{who}: missing {missing:?} in {event}");
}
