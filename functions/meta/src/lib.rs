//! Health and the API's own description. Both are public.

use reservations_http::Incoming;
use reservations_http::config::AppConfig;
use reservations_http::spin_store::{SpinDb, SpinKv};
use reservations_http::{Problem, Reply, render, routes, serve};
use reservations_store::KeyValue;
use reservations_store::schema::{current_version, migrate};
use serde_json::Value;
use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

const OPENAPI: &str = include_str!("../../../docs/openapi.json");

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(routes!("meta"; public: health, openapi), incoming)
}

/// Proves the whole path: the app's secrets are configured, the database answers (and is
/// migrated), the key-value store round-trips a value. An empty `operator_token` or
/// `audit_key` is not ready: every authenticated route would answer 503, so health answers
/// the same 503 problem instead of `ok`.
fn health(_: &Request) -> Result<Reply, Problem> {
    let config = AppConfig::read()?;
    let db = SpinDb::open_default();
    // Requests migrate lazily (a statement that finds the schema behind brings it up to
    // date); health does it at once, so a ready replica reports the latest version, and has
    // every cell's schema in place before the first request reaches it. A cell that cannot
    // be migrated is reported: its nodes' requests fail, the others' are served.
    migrate(&db).map_err(Problem::from)?;
    let schema_version = current_version(&db)?;
    let cells = config
        .cells
        .all()
        .skip(1)
        .map(|cell| {
            let label = cell.label();
            let migrated = migrate(&SpinDb::open(&label)).is_ok();
            (label, migrated)
        })
        .collect();
    let kv = SpinKv::open_default()?;
    let probe = chrono::Utc::now().timestamp_millis().to_string();
    kv.set("healthz/probe", probe.as_bytes())?;
    let read_back = kv.get("healthz/probe")?;
    if read_back.as_deref() != Some(probe.as_bytes()) {
        return Err(Problem::internal(
            "the key-value store did not return what was written",
        ));
    }
    Ok(Reply::ok(render::healthy(
        schema_version,
        cells,
        chrono::Utc::now(),
    )))
}

fn openapi(_: &Request) -> Result<Reply, Problem> {
    let document: Value = serde_json::from_str(OPENAPI)
        .map_err(|e| Problem::internal(format!("the bundled OpenAPI document is invalid: {e}")))?;
    Ok(Reply::ok(document))
}
