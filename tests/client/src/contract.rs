//! The OpenAPI document (`docs/openapi.json`) as a check of real responses: a documented
//! status, the documented headers and content type, and a body that validates against the
//! documented schema (OpenAPI 3.1 schemas are JSON Schema 2020-12, formats included).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};

use crate::Reply;

/// The HTTP methods an OpenAPI path item may document.
pub const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

/// What to do with a request whose (method, path) the document does not describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undocumented {
    /// Not the contract's business (an unknown route, a method answered with 405, the
    /// console's page): nothing to check.
    Skip,
    /// A failure: the caller only sends documented operations.
    Fail,
}

/// The document, compiled schemas, and the `(METHOD, path template, status)` responses
/// checked so far.
pub struct Contract {
    document: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
    seen: Mutex<BTreeSet<(String, String, u16)>>,
}

/// Follows a local `$ref` (`#/components/...`) to the object it names.
pub fn resolve<'d>(document: &'d Value, value: &'d Value) -> &'d Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("only local references: {reference}"));
            let target = document
                .pointer(pointer)
                .unwrap_or_else(|| panic!("dangling reference {reference}"));
            resolve(document, target)
        }
        None => value,
    }
}

impl Contract {
    /// The workspace's `docs/openapi.json`.
    pub fn load() -> Contract {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Contract::new(serde_json::from_str(&text).expect("docs/openapi.json is JSON"))
    }

    pub fn new(document: Value) -> Contract {
        Contract {
            document,
            validators: Mutex::new(HashMap::new()),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// One contract for every client of the process (its compiled schemas are shared).
    pub fn shared() -> Arc<Contract> {
        static SHARED: OnceLock<Arc<Contract>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(Contract::load())).clone()
    }

    pub fn document(&self) -> &Value {
        &self.document
    }

    /// The responses checked so far.
    pub fn seen(&self) -> BTreeSet<(String, String, u16)> {
        self.seen.lock().unwrap().clone()
    }

    /// Counts a response as seen that was checked some other way.
    pub fn record(&self, method: &str, template: &str, status: u16) {
        self.seen.lock().unwrap().insert((
            method.to_ascii_uppercase(),
            template.to_owned(),
            status,
        ));
    }

    /// The documented path template a concrete path falls under (literal segments win).
    pub fn template_of(&self, path: &str) -> Option<String> {
        let path = path.split('?').next().unwrap_or(path);
        let segments: Vec<&str> = path.split('/').collect();
        self.document["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .filter_map(|template| {
                let pattern: Vec<&str> = template.split('/').collect();
                if pattern.len() != segments.len() {
                    return None;
                }
                let mut literal = 0;
                for (p, s) in pattern.iter().zip(&segments) {
                    if p.starts_with('{') {
                        if s.is_empty() {
                            return None;
                        }
                    } else if p == s {
                        literal += 1;
                    } else {
                        return None;
                    }
                }
                Some((literal, template.clone()))
            })
            .max()
            .map(|(_, template)| template)
    }

    /// Documented `(METHOD, template, status)` triples, except server-side failures.
    pub fn documented_responses(&self) -> BTreeSet<(String, String, u16)> {
        let mut all = BTreeSet::new();
        for (template, item) in self.document["paths"].as_object().expect("paths") {
            for method in METHODS {
                let Some(operation) = item.get(method) else {
                    continue;
                };
                for status in operation["responses"]
                    .as_object()
                    .expect("responses")
                    .keys()
                {
                    let status: u16 = status.parse().expect("numeric statuses only");
                    if status < 500 {
                        all.insert((method.to_ascii_uppercase(), template.clone(), status));
                    }
                }
            }
        }
        all
    }

    /// Checks one real response against the document; says what disagrees.
    pub fn check(
        &self,
        method: &str,
        path: &str,
        reply: &Reply,
        undocumented: Undocumented,
    ) -> Result<(), String> {
        let template = self.template_of(path);
        let operation = template
            .as_ref()
            .and_then(|template| self.document["paths"][template].get(method.to_ascii_lowercase()));
        let (Some(template), Some(operation)) = (template, operation) else {
            return match undocumented {
                Undocumented::Skip => Ok(()),
                Undocumented::Fail => Err(format!("{method} {path}: not a documented operation")),
            };
        };
        let what = format!(
            "{method} {path} (documented as {template}) -> {}",
            reply.status
        );
        let response = operation["responses"]
            .get(reply.status.to_string())
            .map(|r| resolve(&self.document, r))
            .ok_or_else(|| {
                format!(
                    "{what}: status {} is not documented for this operation; body: {}",
                    reply.status,
                    reply.text()
                )
            })?;
        if reply.header("x-request-id").is_none_or(str::is_empty) {
            return Err(format!("{what}: no x-request-id"));
        }
        if let Some(headers) = response.get("headers").and_then(Value::as_object) {
            for (name, header) in headers {
                let header = resolve(&self.document, header);
                match reply.header(&name.to_ascii_lowercase()) {
                    None if header["required"] == true => {
                        return Err(format!("{what}: the required header {name} is missing"));
                    }
                    None => {}
                    Some(value) => {
                        if let Some(schema) = header.get("schema") {
                            self.validate_cached(
                                &format!("{method} {template} {} header {name}", reply.status),
                                schema,
                                &json!(value),
                                &format!("{what}: header {name}"),
                            )?;
                        }
                    }
                }
            }
        }
        match response.get("content").and_then(Value::as_object) {
            None if reply.body.is_empty() => {}
            None => return Err(format!("{what}: a body where none is documented")),
            Some(content) => {
                let content_type = reply
                    .header("content-type")
                    .map(|v| v.split(';').next().unwrap_or("").trim().to_owned())
                    .ok_or_else(|| format!("{what}: no content type"))?;
                let media = content.get(&content_type).ok_or_else(|| {
                    format!(
                        "{what}: content type {content_type} is not documented (documented: {:?})",
                        content.keys().collect::<Vec<_>>()
                    )
                })?;
                let body: Value = serde_json::from_slice(&reply.body)
                    .map_err(|e| format!("{what}: the body is not JSON ({e}): {}", reply.text()))?;
                self.validate_cached(
                    &format!("{method} {template} {} {content_type}", reply.status),
                    &media["schema"],
                    &body,
                    &what,
                )?;
            }
        }
        self.record(method, &template, reply.status);
        Ok(())
    }

    /// Validates `instance` against a schema of the document (its `$ref`s resolved against
    /// the document's components), formats included.
    pub fn validate(&self, schema: &Value, instance: &Value, what: &str) -> Result<(), String> {
        let validator = self.compile(schema, what)?;
        Self::run(&validator, instance, what)
    }

    fn validate_cached(
        &self,
        key: &str,
        schema: &Value,
        instance: &Value,
        what: &str,
    ) -> Result<(), String> {
        let cached = self.validators.lock().unwrap().get(key).cloned();
        let validator = match cached {
            Some(validator) => validator,
            None => {
                let validator = Arc::new(self.compile(schema, what)?);
                self.validators
                    .lock()
                    .unwrap()
                    .insert(key.to_owned(), validator.clone());
                validator
            }
        };
        Self::run(&validator, instance, what)
    }

    fn compile(&self, schema: &Value, what: &str) -> Result<jsonschema::Validator, String> {
        let mut root = schema.clone();
        let root_map = root.as_object_mut().expect("a schema object");
        root_map.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        root_map.insert("components".into(), self.document["components"].clone());
        jsonschema::options()
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| format!("{what}: the documented schema does not compile: {e}"))
    }

    fn run(validator: &jsonschema::Validator, instance: &Value, what: &str) -> Result<(), String> {
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{what}: does not match the documented schema:\n  {}\ninstance: {instance}",
                errors.join("\n  ")
            ))
        }
    }
}
