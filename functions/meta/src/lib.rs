//! Health and the API's own description. Both are public.

use reservations_http::Incoming;
use reservations_http::auth::random_hex;
use reservations_http::cell_health::lost_lately;
use reservations_http::config::AppConfig;
use reservations_http::spin_store::{SpinDb, SpinKv};
use reservations_http::{Problem, Reply, render, routes, serve};
use reservations_store::KeyValue;
use reservations_store::schema::{LATEST_VERSION, current_version, migrate};
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
    let cells = config
        .cells
        .all()
        .skip(1)
        .map(|cell| {
            let label = cell.label();
            let answering =
                !lost_lately(&kv, &label, chrono::Utc::now()) && cell_up_to_date(&kv, &label);
            (label, answering)
        })
        .collect();
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

/// Whether the cell labelled `label` has this build's schema: migrated now, or by an earlier
/// health check, as the key-value store remembers. A cell once migrated is not asked again,
/// so a cell whose server stalls or is down costs health nothing: the replicas stay ready and
/// every other cell's nodes are served; the requests that lose it say so
/// (`reservations_http::cell_health`, docs/design.md, "Cells").
fn cell_up_to_date(kv: &SpinKv, label: &str) -> bool {
    let memory = format!("healthz/cells/{label}/schema-version");
    let latest = LATEST_VERSION.to_string();
    if kv.get(&memory).ok().flatten().as_deref() == Some(latest.as_bytes()) {
        return true;
    }
    let migrated = migrate(&SpinDb::open(label)).is_ok();
    if migrated {
        // Remembered or not, the cell is up to date; a health check that could not write
        // the memory migrates it again next time.
        let _ = kv.set(&memory, latest.as_bytes());
    }
    migrated
}

fn openapi(_: &Request) -> Result<Reply, Problem> {
    let document: Value = serde_json::from_str(OPENAPI)
        .map_err(|e| Problem::internal(format!("the bundled OpenAPI document is invalid: {e}")))?;
    Ok(Reply::ok(document))
}
