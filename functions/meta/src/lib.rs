//! Health and the API's own description. Both are public.

use reservations_http::Incoming;
use reservations_http::auth::random_hex;
use reservations_http::cell_health::cells_answering;
use reservations_http::config::AppConfig;
use reservations_http::config::{SpinDb, SpinKv};
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
    // every cell's schema in place before the first request reaches it.
    migrate(&db).map_err(Problem::from)?;
    let schema_version = current_version(&db)?;
    let kv = SpinKv::open_default()?;
    let cells = cells_answering(&config, &kv);
    key_value_round_trips(&kv)?;
    Ok(Reply::ok(render::healthy(
        schema_version,
        cells,
        chrono::Utc::now(),
    )))
}

/// Writes a value under a key of this check's own, reads it back and deletes it: replicas
/// sharing one key-value store check at once, and each must read its own value.
fn key_value_round_trips(kv: &SpinKv) -> Result<(), Problem> {
    let probe = random_hex(8);
    let key = format!("healthz/probe/{probe}");
    kv.set(&key, probe.as_bytes())?;
    let read_back = kv.get(&key)?;
    kv.delete(&key)?;
    if read_back.as_deref() != Some(probe.as_bytes()) {
        return Err(Problem::internal(
            "the key-value store did not return what was written",
        ));
    }
    Ok(())
}

fn openapi(_: &Request) -> Result<Reply, Problem> {
    let document: Value = serde_json::from_str(OPENAPI)
        .map_err(|e| Problem::internal(format!("the bundled OpenAPI document is invalid: {e}")))?;
    Ok(Reply::ok(document))
}
