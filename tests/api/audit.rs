//! The audit trail: every mutation appends exactly one event (in its own transaction) with
//! who, what, where, which units, which VMs were terminated or skipped, why, and the
//! request id; refusals, reads and dry runs append none. Operators read everything, an org
//! (with audit.read) the events on its own nodes, reservations, VMs and keys. Filters, time
//! ranges and cursor pagination; the hash chain and its verification, which finds tampering.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use api_support::contract::{assert_event_fits_its_view, audit_actions};
use api_support::{App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, rfc3339_from_now};

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
        .get(&format!("/v1/audit?cursor={before}&limit=5"))
        .expect_status(200)
        .json();
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{page}");
    let event = items[0].clone();
    assert_eq!(event["seq"], before + 1);
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
fn every_mutation_appends_one_event_with_all_its_fields() {
    let app = App::start();
    // The components create the schema on first use.
    app.anonymous().get("/v1/healthz").expect_status(200);
    let (actors, spare_id) = orgs_and_keys_are_audited(&app);
    let rid = nodes_reservations_and_releases_are_audited(&app, &actors);
    let reservation = format!("/v1/nodes/n1/reservations/{rid}");
    vms_and_reclaims_are_audited(&app, &actors, &rid, &reservation);
    later_changes_are_audited(&app, &actors, &rid, &reservation, &spare_id);
    every_action_appeared_and_filters(&actors.operator);
}

/// Creating orgs and keys; returns the actors and the id of a spare key made by the owner.
fn orgs_and_keys_are_audited(app: &App) -> (Actors, String) {
    let operator = app.operator();
    let event = one_event(app, || {
        traced(&operator, "rq-org").post("/v1/orgs", &json!({ "id": "owner", "name": "Owner" }))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "org.create", "visibleTo": ["owner"], "vmOwners": [], "orgId": "owner",
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-org",
        })
    );
    app.org("tenant");

    let event = one_event(app, || {
        operator.post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "owner admin", "role": "admin" }),
        )
    });
    // The event names the key by id, never its secret.
    let keys = operator
        .get("/v1/orgs/owner/keys")
        .expect_status(200)
        .json();
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "apikey.create", "visibleTo": ["owner"], "vmOwners": [], "orgId": "owner",
            "subjectId": keys["items"][0]["id"],
            "unitIds": [], "terminated": [], "skipped": [],
        })
    );
    let owner = app.key("owner", "admin", None);
    let owner_key = key_id(&owner);
    let tenant = app.key("tenant", "member", None);
    let tenant_key = key_id(&tenant);

    let mut spare_id = String::new();
    let event = one_event(app, || {
        let reply = traced(&owner, "rq-key").post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "spare", "role": "viewer" }),
        );
        spare_id = reply.json()["id"].as_str().expect("id").to_owned();
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "apikey.create", "visibleTo": ["owner"], "vmOwners": [],
            "orgId": "owner", "subjectId": spare_id,
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-key",
        })
    );
    let actors = Actors {
        operator,
        owner,
        owner_key,
        tenant,
        tenant_key,
    };
    (actors, spare_id)
}

/// Creating a node and a reservation, releasing units; returns the reservation's id.
fn nodes_reservations_and_releases_are_audited(app: &App, actors: &Actors) -> String {
    let Actors {
        operator,
        owner,
        owner_key,
        ..
    } = actors;
    let units = ["u0", "u1", "u2", "u3", "u4", "u5"];
    let event = one_event(app, || {
        traced(operator, "rq-node").put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": units }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "node.create", "visibleTo": ["owner"], "vmOwners": [], "nodeId": "n1",
            "orgId": "owner", "unitIds": units, "terminated": [], "skipped": [],
            "clientRequestId": "rq-node",
        })
    );

    let mut rid = String::new();
    let event = one_event(app, || {
        let reply = traced(owner, "rq-reserve").post(
            "/v1/nodes/n1/reservations",
            &json!({
                "reservedUnitIds": ["u0", "u1", "u2", "u3"],
                "allowedOrgIds": ["tenant"],
                "managingOrgIds": ["tenant"],
                "startsAt": rfc3339_from_now(-3600),
                "reason": "contract 7",
            }),
        );
        rid = reply.json()["id"].as_str().expect("id").to_owned();
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.create", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u1", "u2", "u3"],
            "terminated": [], "skipped": [], "reason": "contract 7", "clientRequestId": "rq-reserve",
        })
    );
    let reservation = format!("/v1/nodes/n1/reservations/{rid}");

    let event = one_event(app, || {
        traced(owner, "rq-release").post(
            &format!("{reservation}/release"),
            &json!({ "unitIds": ["u0", "u1"], "reason": "idle overnight" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.release", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u1"],
            "terminated": [], "skipped": [], "reason": "idle overnight",
            "clientRequestId": "rq-release",
        })
    );
    rid
}

/// Placing VMs, a dry run that appends nothing, a reclaim, stopping a VM.
fn vms_and_reclaims_are_audited(app: &App, actors: &Actors, rid: &str, reservation: &str) {
    let Actors {
        owner,
        owner_key,
        tenant,
        tenant_key,
        ..
    } = actors;
    let mut spot = String::new();
    let event = one_event(app, || {
        let reply = traced(tenant, "rq-spot").post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u0"], "tier": "spot" }),
        );
        spot = vm_id(&reply);
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": tenant_key, "actorOrgId": "tenant", "action": "vm.place", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "vmId": spot, "orgId": "tenant", "unitIds": ["u0"],
            "terminated": [], "skipped": [], "clientRequestId": "rq-spot",
        })
    );
    let mut community = String::new();
    one_event(app, || {
        let reply = tenant.post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u2"], "tier": "community" }),
        );
        community = vm_id(&reply);
        reply
    });

    no_event(app, "a dry run", || {
        owner
            .post(
                &format!("{reservation}/reclaim/dry-run"),
                &json!({ "unitIds": ["u0", "u2"], "reason": "what if" }),
            )
            .expect_status(200);
    });

    let event = one_event(app, || {
        traced(owner, "rq-reclaim").post(
            &format!("{reservation}/reclaim"),
            &json!({ "unitIds": ["u0", "u2"], "reason": "peak demand" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.reclaim", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u2"],
            "terminated": [spot], "skipped": [community], "reason": "peak demand",
            "clientRequestId": "rq-reclaim",
        })
    );

    let event = one_event(app, || {
        traced(tenant, "rq-stop").delete(&format!("/v1/vms/{community}"))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": tenant_key, "actorOrgId": "tenant", "action": "vm.terminate", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "vmId": community, "orgId": "tenant", "unitIds": ["u2"],
            "terminated": [community], "skipped": [], "reason": "stopped", "clientRequestId": "rq-stop",
        })
    );
}

/// A topology change, a reaffirmation, a cancellation and a key revoked.
fn later_changes_are_audited(
    app: &App,
    actors: &Actors,
    rid: &str,
    reservation: &str,
    spare_id: &str,
) {
    let Actors {
        operator,
        owner,
        owner_key,
        ..
    } = actors;
    let event = one_event(app, || {
        traced(owner, "rq-topology").put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4"] }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "node.update", "visibleTo": ["owner"], "vmOwners": [],
            "nodeId": "n1", "orgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4"],
            "terminated": [], "skipped": [rid], "clientRequestId": "rq-topology",
        })
    );

    let event = one_event(app, || {
        traced(operator, "rq-reaffirm").post(
            &format!("{reservation}/reaffirm"),
            &json!({ "reason": "units checked" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "reservation.reaffirm", "visibleTo": ["owner", "tenant"], "vmOwners": [], "nodeId": "n1",
            "reservationId": rid, "unitIds": ["u0", "u1", "u2", "u3"], "terminated": [],
            "skipped": [], "reason": "units checked", "clientRequestId": "rq-reaffirm",
        })
    );

    let event = one_event(app, || {
        traced(owner, "rq-cancel").post(
            &format!("{reservation}/cancel"),
            &json!({ "reason": "contract ended" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.cancel", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": [], "terminated": [],
            "skipped": [], "reason": "contract ended", "clientRequestId": "rq-cancel",
        })
    );

    let event = one_event(app, || {
        traced(owner, "rq-revoke").delete(&format!("/v1/orgs/owner/keys/{spare_id}"))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "apikey.revoke", "visibleTo": ["owner"], "vmOwners": [],
            "orgId": "owner", "subjectId": spare_id,
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-revoke",
        })
    );
}

/// Every action the trail knows has appeared, and the listing filters by each.
fn every_action_appeared_and_filters(operator: &Client) {
    let all = all_events(operator, "");
    let seen: BTreeSet<String> = actions(&all).into_iter().collect();
    let known = audit_actions();
    assert_eq!(known.len(), 12, "the contract's actions: {known:?}");
    for action in &known {
        assert!(seen.contains(action), "no {action} event");
        let filtered = all_events(operator, &format!("&action={action}"));
        assert!(!filtered.is_empty());
        assert!(filtered.iter().all(|e| e["action"] == action.as_str()));
    }
    assert_eq!(seen, known.into_iter().collect(), "unexpected actions");
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

#[test]
fn operators_see_everything_and_orgs_only_their_own() {
    let app = App::start();
    let (owner, tenant, stranger, rid, _) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    assert_eq!(everything.len() as i64, event_count(&app));

    let owner_sees = all_events(&owner, "");
    let tenant_sees = all_events(&tenant, "");
    let stranger_sees = all_events(&stranger, "");
    let concerns = |event: &Value, org: &str| {
        event["orgId"] == org || event["actorOrgId"] == org || event["nodeId"] == "n1"
    };
    // The owner: its org and keys, its node, the reservation on it, VMs on its units.
    assert!(
        owner_sees.iter().all(|e| concerns(e, "owner")),
        "{owner_sees:?}"
    );
    for action in [
        "org.create",
        "apikey.create",
        "node.create",
        "reservation.create",
        "reservation.release",
        "vm.place",
    ] {
        assert!(
            actions(&owner_sees).contains(&action.to_owned()),
            "owner misses {action}"
        );
    }
    // The tenant: its org and keys, the reservation it is the audience of, its VM; not the
    // owner's node registration or the owner's keys.
    assert_eq!(
        actions(&tenant_sees),
        [
            "org.create",
            "apikey.create",
            "apikey.create",
            "reservation.create",
            "reservation.release",
            "vm.place"
        ]
    );
    assert!(tenant_sees.iter().all(|e| e["orgId"] != "owner"));
    assert!(
        tenant_sees
            .iter()
            .filter(|e| e["reservationId"].is_string())
            .all(|e| e["reservationId"] == rid.as_str())
    );
    // The stranger: its own org and keys only.
    assert_eq!(actions(&stranger_sees), ["org.create", "apikey.create"]);
    assert!(stranger_sees.iter().all(|e| e["orgId"] == "stranger"));
    assert!(all_events(&stranger, "&nodeId=n1").is_empty());
    assert!(all_events(&stranger, &format!("&reservationId={rid}")).is_empty());

    // Orgs see a subset of the operator's trail, events identical but for what only a
    // verifier needs (who else sees each event, and the hash version).
    let as_principals_see: Vec<Value> = everything
        .iter()
        .map(|event| {
            let mut event = event.clone();
            let object = event.as_object_mut().expect("an event object");
            for verifier_only in [
                "visibleTo",
                "vmOwners",
                "hashVersion",
                "chainSeq",
                "prevHash",
                "afterSeq",
            ] {
                assert!(object.remove(verifier_only).is_some(), "{verifier_only}");
            }
            // The newest event of each chain is not sealed yet.
            object.remove("seal");
            event
        })
        .collect();
    for seen in [&owner_sees, &tenant_sees, &stranger_sees] {
        for event in seen.iter() {
            assert!(
                as_principals_see.contains(event),
                "{event} is not the operator's"
            );
        }
    }

    // Without audit.read: 403, whatever the role's other permissions.
    for (role, permissions) in [
        ("member", None),
        ("viewer", None),
        ("admin", Some(&["node.read", "reservation.read"][..])),
    ] {
        app.key("owner", role, permissions)
            .get("/v1/audit")
            .expect_problem(403, "forbidden");
    }
    app.anonymous()
        .get("/v1/audit")
        .expect_problem(401, "unauthorized");
}

#[test]
fn filters_time_ranges_and_cursor_pagination() {
    let app = App::start();
    // Three orgs created at distinct, known times, then the rest of the world now.
    for (hours, org) in [(-3, "early"), (-2, "middle"), (-1, "late")] {
        app.set_clock_offset_secs(hours * 3600);
        app.org(org);
    }
    app.set_clock_offset_secs(0);
    let (_, _, _, rid, vm) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    let at = |org: &str| {
        everything
            .iter()
            .find(|e| e["action"] == "org.create" && e["orgId"] == org)
            .expect("org event")["at"]
            .as_str()
            .expect("at")
            .to_owned()
    };
    let orgs_of = |events: Vec<Value>| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["action"] == "org.create")
            .map(|e| e["orgId"].as_str().expect("orgId").to_owned())
            .collect()
    };

    // since is inclusive, until exclusive.
    let middle = at("middle");
    let late = at("late");
    assert_eq!(
        orgs_of(all_events(
            &operator,
            &format!("&since={middle}&until={late}")
        )),
        ["middle"]
    );
    assert_eq!(
        orgs_of(all_events(&operator, &format!("&until={middle}"))),
        ["early"]
    );
    let recent = all_events(&operator, &format!("&since={}", rfc3339_from_now(-600)));
    assert!(
        recent
            .iter()
            .all(|e| e["orgId"] != "early" && e["orgId"] != "late")
    );
    assert_eq!(recent.len() + 3, everything.len());
    // Any offset is accepted.
    let middle_plus_one = chrono::DateTime::parse_from_rfc3339(&middle)
        .unwrap()
        .with_timezone(&chrono::FixedOffset::east_opt(3600).unwrap())
        .to_rfc3339()
        .replace('+', "%2B");
    assert_eq!(
        orgs_of(all_events(
            &operator,
            &format!("&since={middle_plus_one}&until={late}")
        )),
        ["middle"]
    );

    // nodeId, reservationId, action, and their combination.
    let on_node = all_events(&operator, "&nodeId=n1");
    assert_eq!(
        actions(&on_node),
        [
            "node.create",
            "reservation.create",
            "reservation.release",
            "vm.place"
        ]
    );
    let on_reservation = all_events(&operator, &format!("&reservationId={rid}"));
    assert_eq!(
        actions(&on_reservation),
        ["reservation.create", "reservation.release"]
    );
    let combined = all_events(&operator, "&nodeId=n1&action=vm.place");
    assert_eq!(combined.len(), 1);
    assert_eq!(combined[0]["vmId"], vm.as_str());
    assert!(all_events(&operator, "&nodeId=n2").is_empty());

    // Pages of two, in order, each event once, the last page without a cursor.
    let mut paged: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/audit?limit=2".to_owned(),
            Some(c) => format!("/v1/audit?limit=2&cursor={c}"),
        };
        let page = operator.get(&path).expect_status(200).json();
        let items = page["items"].as_array().expect("items").clone();
        assert!(items.len() <= 2);
        pages += 1;
        paged.extend(items);
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 100, "the cursor does not advance");
    }
    assert_eq!(paged, everything);
    assert_eq!(pages, everything.len().div_ceil(2));
    let seqs: Vec<i64> = paged.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {seqs:?}"
    );
    // A filtered listing pages the same way.
    let first = operator
        .get("/v1/audit?action=org.create&limit=1")
        .expect_status(200)
        .json();
    let next = first["nextCursor"].as_str().expect("more org events");
    let second = operator
        .get(&format!(
            "/v1/audit?action=org.create&limit=1&cursor={next}"
        ))
        .expect_status(200)
        .json();
    assert_eq!(second["items"][0]["orgId"], "middle");

    // Malformed parameters are 400 naming the parameter.
    for (query, parameter) in [
        ("cursor=abc", "cursor"),
        ("since=yesterday", "since"),
        ("until=2026-13-01T00:00:00Z", "until"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("action=vm.explode", "action"),
        ("nodeId=a&nodeId=b", "nodeId"),
        ("node=n1", "node"),
    ] {
        let problem = operator
            .get(&format!("/v1/audit?{query}"))
            .expect_status(400)
            .json();
        assert_eq!(problem["parameter"], parameter, "{query}: {problem}");
    }
}

#[test]
fn the_chain_verifies_and_tampering_is_found() {
    let app = App::start_on_one_database();
    let (owner, tenant, _, _, _) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    // Each chain links event to event, in its own order, from the genesis hash; every event
    // but the newest of its chain was sealed by a later write.
    let mut heads: BTreeMap<String, (i64, String, Option<String>)> = BTreeMap::new();
    let mut by_place: BTreeMap<(String, i64), &Value> = BTreeMap::new();
    for event in &everything {
        let chain = event["chain"].as_str().expect("chain").to_owned();
        let (seq, previous, _) =
            heads
                .get(&chain)
                .cloned()
                .unwrap_or((0, GENESIS.to_owned(), None));
        assert_eq!(event["chainSeq"], seq + 1, "the chain's places: {event}");
        assert_eq!(
            event["prevHash"],
            previous.as_str(),
            "the chain links: {event}"
        );
        assert!(
            event["afterSeq"].as_i64().expect("afterSeq") <= seq,
            "an event comes after what its writer saw: {event}"
        );
        by_place.insert((chain.clone(), seq + 1), event);
        let seal = event.get("seal").and_then(Value::as_str).map(str::to_owned);
        heads.insert(
            chain,
            (
                seq + 1,
                event["hash"].as_str().expect("hash").to_owned(),
                seal,
            ),
        );
    }
    assert!(heads.contains_key("platform") && heads.contains_key("node:n1"));
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    let chains: Vec<Value> = heads
        .iter()
        .map(|(chain, (seq, _, newest_seal))| {
            assert_eq!(
                newest_seal, &None,
                "the newest event of {chain} is unsealed"
            );
            match seq {
                1 => json!({"chain": chain, "ok": true, "eventsChecked": seq, "unsealed": 1}),
                _ => {
                    let sealed = by_place[&(chain.clone(), seq - 1)];
                    json!({"chain": chain, "ok": true, "eventsChecked": seq, "unsealed": 1,
                           "lastSeq": seq - 1, "lastHash": sealed["seal"]})
                }
            }
        })
        .collect();
    assert_eq!(
        verified,
        json!({"ok": true, "eventsChecked": everything.len(), "chains": chains})
    );
    let one = operator
        .get("/v1/audit/verify?nodeId=n1")
        .expect_status(200)
        .json();
    assert_eq!(one["chains"].as_array().unwrap().len(), 1);
    assert_eq!(one["chains"][0]["chain"], "node:n1");

    // Verifying is for operators only.
    owner
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    tenant
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    app.anonymous()
        .get("/v1/audit/verify")
        .expect_problem(401, "unauthorized");

    // A changed reason breaks the release's chain at that event.
    let (release_seq, release_chain, release_place): (i64, String, i64) = app
        .db()
        .query_row(
            "SELECT seq, chain, chain_seq FROM audit_events WHERE action = 'reservation.release'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    app.db()
        .execute(
            "UPDATE audit_events SET reason = 'nothing to see' WHERE seq = ?1",
            [release_seq],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(broken["ok"], false, "{broken}");
    assert_eq!(
        (
            broken["brokenChain"].clone(),
            broken["firstBrokenSeq"].clone()
        ),
        (json!(release_chain), json!(release_place))
    );
    // Put back, it verifies again.
    app.db()
        .execute(
            "UPDATE audit_events SET reason = NULL WHERE seq = ?1",
            [release_seq],
        )
        .unwrap();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );

    // Another actor, or a deleted event: each is found where it is.
    app.db()
        .execute(
            "UPDATE audit_events SET actor_key_id = 'key-someone-else' \
             WHERE chain = 'platform' AND chain_seq = 2",
            [],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(
        (
            broken["ok"].clone(),
            broken["brokenChain"].clone(),
            broken["firstBrokenSeq"].clone()
        ),
        (json!(false), json!("platform"), json!(2))
    );
    app.db()
        .execute(
            "DELETE FROM audit_events WHERE chain = 'platform' AND chain_seq = 2",
            [],
        )
        .unwrap();
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(broken["ok"], false);
    assert_eq!(broken["firstBrokenSeq"], 2);
    assert!(
        broken["problem"]
            .as_str()
            .unwrap()
            .contains("chain platform"),
        "{broken}"
    );
}

/// Rewrites every event as a forger with the database but not `audit_key` would: into the
/// one old chain, as unkeyed version-1 events (`edit` changes each first), each hash
/// recomputed with plain SHA-256 and linked to the one before.
fn rehash_unkeyed(app: &App, edit: &str) {
    use sha2::{Digest, Sha256};
    let db = app.db();
    db.execute_batch(&format!(
        "{edit}; UPDATE audit_events SET chain = 'trail', chain_seq = seq + 1000000; \
         UPDATE audit_events SET chain_seq = seq, hash_version = 1;"
    ))
    .unwrap();
    let mut statement = db
        .prepare(
            "SELECT seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, \
             vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason, request_id, \
             visible_to FROM audit_events ORDER BY seq",
        )
        .unwrap();
    let rows: Vec<(i64, Value)> = statement
        .query_map([], |row| {
            let text = |i: usize| row.get::<_, Option<String>>(i);
            let list = |i: usize| -> rusqlite::Result<Value> {
                Ok(serde_json::from_str(&row.get::<_, String>(i)?).unwrap())
            };
            Ok((
                row.get(0)?,
                json!([
                    row.get::<_, i64>(0)?,
                    text(1)?,
                    row.get::<_, i64>(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    text(6)?,
                    text(7)?,
                    text(8)?,
                    text(9)?,
                    text(10)?,
                    list(11)?,
                    list(12)?,
                    list(13)?,
                    text(14)?,
                    text(15)?,
                    list(16)?
                ]),
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut prev = GENESIS.to_owned();
    for (seq, content) in rows {
        let hash = hex::encode(Sha256::digest(format!("{prev}\n{content}")));
        db.execute(
            "UPDATE audit_events SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

#[test]
fn a_trail_rehashed_without_the_key_never_verifies() {
    let app = App::start_on_one_database();
    let (owner, _, _, rid, _) = shared_world(&app);
    owner
        .post(
            &format!("/v1/nodes/n1/reservations/{rid}/reclaim"),
            &json!({ "unitIds": ["u0"], "reason": "internal: customer escalation" }),
        )
        .expect_status(200);
    let operator = app.operator();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );
    // The reclaim's reason and what it terminated forged, every event re-hashed unkeyed.
    rehash_unkeyed(
        &app,
        "UPDATE audit_events SET reason = 'routine maintenance', terminated = '[]' \
         WHERE action = 'reservation.reclaim'",
    );
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(
        verified["ok"], false,
        "the forged trail verified: {verified}"
    );
    assert_eq!(
        (
            verified["brokenChain"].clone(),
            verified["firstBrokenSeq"].clone()
        ),
        (json!("trail"), json!(1))
    );
    assert!(
        verified["problem"]
            .as_str()
            .unwrap()
            .contains("which its place does not allow"),
        "{verified}"
    );
}

#[test]
fn an_earlier_builds_events_are_sealed_and_shown_by_need_to_know() {
    // What a build before per-node chains and need to know left: one unkeyed chain, and a
    // reclaim that showed the spot buyer whose VM it terminated all of it.
    let app = App::start_on_database(|path| {
        let db = reservations_store::native::NativeDb::open(path).unwrap();
        reservations_store::native::earlier_build_with_an_unkeyed_reclaim(&db).unwrap();
    });
    let buyer = app.key("buyer", "admin", None);
    let tenant = app.key("tenant", "admin", None);
    let reclaim = |client: &Client| {
        let page = client
            .get("/v1/audit?action=reservation.reclaim")
            .expect_status(200)
            .json();
        let items = page["items"].as_array().unwrap().clone();
        assert_eq!(items.len(), 1, "{page}");
        items[0].clone()
    };
    // The spot buyer sees only that its VM was terminated (the fields the contract allows
    // its view): not the reservation, its reason or its parties, which the earlier build
    // showed it.
    let seen = reclaim(&buyer);
    assert_eq!(seen["view"], "own-vms", "{seen}");
    assert_event_fits_its_view("the spot buyer", &seen);
    assert_eq!(seen["terminated"], json!(["vm-1"]), "{seen}");
    // The reservation's audience sees all of it, as before.
    let seen = reclaim(&tenant);
    assert_eq!(seen["reservationId"], "r1", "{seen}");
    assert_eq!(seen["reason"], "internal: customer escalation", "{seen}");
    // Sealed under the key, the old chain verifies, and says when it was sealed.
    let verified = app
        .operator()
        .get("/v1/audit/verify")
        .expect_status(200)
        .json();
    assert_eq!(verified["ok"], true, "{verified}");
    let trail = verified["chains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|chain| chain["chain"] == "trail")
        .unwrap_or_else(|| panic!("no trail chain: {verified}"));
    assert_eq!(trail["eventsChecked"], 1, "{verified}");
    assert!(trail["sealedAt"].is_string(), "{verified}");
}
