//! The audit trail: every mutation appends exactly one event (in its own transaction) with
//! who, what, where, which units, which VMs were terminated or skipped, why, and the
//! request id; refusals, reads and dry runs append none. Operators read everything, an org
//! (with audit.read) the events on its own nodes, reservations, VMs and keys. Filters, time
//! ranges and cursor pagination; the hash chain and its verification, which finds tampering.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use api_support::contract::{assert_event_fits_its_view, audit_actions};
use api_support::{App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, rfc3339_from_now};

mod chains;
mod every_mutation;
mod listing;

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn event_count(app: &App) -> i64 {
    app.db()
        .query_row("SELECT COUNT(*) FROM audit_events", [], |row| row.get(0))
        .expect("count events")
}

/// Every event `client` may read matching `query`, following the cursor to the end.
fn all_events(client: &Client, query: &str) -> Vec<Value> {
    client.all_items(&format!("/v1/audit?limit=1000{query}"))
}

fn actions(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["action"].as_str().expect("action").to_owned())
        .collect()
}

/// An event without what the trail itself assigns (sequence, id, time, hashes, the server's
/// request id, which [`one_event`] checks against the response).
fn content(event: &Value) -> Value {
    let mut map: Map<String, Value> = event.as_object().expect("an event object").clone();
    for assigned in [
        "seq",
        "chain",
        "chainSeq",
        "id",
        "at",
        "prevHash",
        "hash",
        "afterSeq",
        "requestId",
    ] {
        assert!(map.remove(assigned).is_some(), "{event} lacks {assigned}");
    }
    map.remove("seal");
    assert_eq!(map.remove("hashVersion"), Some(json!(5)), "{event}");
    Value::Object(map)
}

/// The id of the VM a placement created (the server chooses it).
#[track_caller]
fn vm_id(reply: &Reply) -> String {
    assert_eq!(reply.status, 201, "the placement failed: {}", reply.text());
    reply.json()["id"].as_str().expect("id").to_owned()
}

/// Runs a mutation and returns the one event it appended, checking that it appended exactly
/// one, that the event carries the response's request id, and that its time is now.
#[track_caller]
fn one_event(app: &App, mutation: impl FnOnce() -> Reply) -> Value {
    let before = event_count(app);
    let end = trail_end(app);
    let reply = mutation();
    assert!(reply.status < 300, "the mutation failed: {}", reply.text());
    let request_id = reply
        .header("x-request-id")
        .expect("x-request-id")
        .to_owned();
    assert_eq!(
        event_count(app),
        before + 1,
        "exactly one event per mutation"
    );
    let page = app
        .operator()
        .get(&format!("/v1/audit?cursor={end}&limit=5"))
        .expect_status(200)
        .json();
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{page}");
    let event = items[0].clone();
    assert_eq!(event["requestId"], request_id.as_str());
    let at =
        chrono::DateTime::parse_from_rfc3339(event["at"].as_str().expect("at")).expect("RFC 3339");
    let age = chrono::Utc::now().signed_duration_since(at);
    assert!(
        age.num_seconds().abs() < 60,
        "at is the mutation's time: {event}"
    );
    event
}

/// Where the operator's reading of the whole trail ends now: the events feed's cursor once
/// it has read everything (it moves over every event an operator sees).
fn trail_end(app: &App) -> String {
    let operator = app.operator();
    let mut cursor = "p0".to_owned();
    loop {
        let page = operator
            .get(&format!("/v1/events?after={cursor}&limit=1000"))
            .expect_status(200)
            .json();
        let next = page["nextCursor"].as_str().expect("nextCursor").to_owned();
        if page["items"].as_array().is_none_or(Vec::is_empty) {
            return next;
        }
        cursor = next;
    }
}

#[track_caller]
fn no_event(app: &App, what: &str, requests: impl FnOnce()) {
    let before = event_count(app);
    requests();
    assert_eq!(event_count(app), before, "{what} appended an event");
}

fn key_id(client: &Client) -> String {
    client.get("/v1/whoami").expect_status(200).json()["keyId"]
        .as_str()
        .expect("keyId")
        .to_owned()
}

/// The org keys that act in the trail, with the key ids their events name.
struct Actors {
    operator: Client,
    owner: Client,
    owner_key: String,
    tenant: Client,
    tenant_key: String,
}

fn traced(client: &Client, request_id: &str) -> Client {
    client.with_header("x-request-id", request_id)
}

#[test]
fn refusals_and_reads_append_nothing() {
    let app = App::start();
    app.org("owner");
    app.org("tenant");
    let owner = app.key("owner", "admin", None);
    let tenant = app.key("tenant", "member", None);
    app.node("n1", "owner", &["u0", "u1"]);
    let reservation = app.reservation("n1", &["u0"], &["tenant"], &[]);
    let reservation = format!(
        "/v1/nodes/n1/reservations/{}",
        reservation["id"].as_str().expect("id")
    );
    let release = format!("{reservation}/release");
    no_event(&app, "a 404 release", || {
        tenant
            .post(&release, &json!({ "unitIds": ["u0"] }))
            .expect_problem(404, "not-found");
    });
    no_event(&app, "a 422 release", || {
        owner
            .post(&release, &json!({ "unitIds": ["u1"] }))
            .expect_problem(422, "units-not-in-reservation");
    });
    no_event(&app, "a 400 release", || {
        owner
            .post(&release, &json!({ "unitIds": ["u0"], "x": 1 }))
            .expect_problem(400, "unknown-field");
    });
    no_event(&app, "a 409 org", || {
        app.operator()
            .post("/v1/orgs", &json!({ "id": "owner", "name": "again" }))
            .expect_problem(409, "already-exists");
    });
    no_event(&app, "a 403 node", || {
        owner
            .put(
                "/v1/nodes/n2",
                &json!({ "ownerOrgId": "owner", "unitIds": ["a"] }),
            )
            .expect_problem(403, "forbidden");
    });
    no_event(&app, "reads", || {
        owner.get(&reservation).expect_status(200);
        owner.get("/v1/nodes/n1").expect_status(200);
        owner.get("/v1/audit").expect_status(200);
        app.operator().get("/v1/audit/verify").expect_status(200);
    });
    no_event(&app, "a dry run", || {
        owner
            .post(
                &format!("{reservation}/reclaim/dry-run"),
                &json!({ "unitIds": ["u0"] }),
            )
            .expect_status(200);
    });
}

/// Orgs owner (node n1, reservation of u0..u1 with audience `tenant`), tenant (a spot VM on
/// the released u0), stranger (nothing to do with either); `(operator, owner, tenant,
/// stranger)` keys with audit.read, the reservation's id and the spot VM's.
fn shared_world(app: &App) -> (Client, Client, Client, String, String) {
    let made = Scenario::new()
        .orgs(&["owner", "tenant", "stranger"])
        .key("owner", "owner", "capacity-manager")
        .key("tenant member", "tenant", "member")
        .key("tenant", "tenant", "admin")
        .key("stranger", "stranger", "admin")
        .node("n1", "owner", &["u0", "u1", "u2"])
        .reservation(
            "r",
            ReservationSpec::on("n1", &["u0", "u1"]).audience(&["tenant"]),
        )
        .release(ReleaseSpec::of("r", &["u0"]).by("owner"))
        .vm("tenant member", "n1", &["u0"], "spot")
        .make_in(app);
    (
        made.client("owner"),
        made.client("tenant"),
        made.client("stranger"),
        made.reservation_id("r"),
        made.vms()[0].clone(),
    )
}
