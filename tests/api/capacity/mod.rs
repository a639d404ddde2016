//! Release, reclaim and dry run over HTTP, against the three built components: the v1 contract's
//! response fields, who may call them (and the 404 that hides the rest), every refusal, the
//! no-op cases, a dry run that writes nothing, a reclaim that is one transaction, and the
//! full double-sell cycle.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

use api_support::{
    App, Client, Reply, ReservationSpec, Scenario, at_once, place_vm, placed_vm, rfc3339_from_now,
    sorted, strings,
};

mod dry_run;
mod reclaim;
mod release;

const NODE: &str = "n1";
const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
const MANAGER: &str = "mgr";
const OUTSIDER: &str = "spotco";
const UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];
const RESERVED: [&str; 4] = ["g0", "g1", "g2", "g3"];

/// The reservation fields of the v1 contract's response schema.
const RESERVATION_FIELDS: [&str; 14] = [
    "allowedOrgIds",
    "contractRef",
    "createdAt",
    "endsAt",
    "id",
    "managingOrgIds",
    "nodeId",
    "reason",
    "releasedUnitIds",
    "reservedUnitIds",
    "startsAt",
    "status",
    "topologyGen",
    "updatedAt",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Release,
    Reclaim,
    DryRun,
}

impl Op {
    const ALL: [Op; 3] = [Op::Release, Op::Reclaim, Op::DryRun];

    fn suffix(self) -> &'static str {
        match self {
            Op::Release => "release",
            Op::Reclaim => "reclaim",
            Op::DryRun => "reclaim/dry-run",
        }
    }
}

/// Node `n1` of `owner` (units g0..g7) with an active reservation of g0..g3 that has every
/// optional field: audience `aud`, managed by `mgr`, ending in a day.
struct World {
    app: App,
    reservation_id: String,
    /// The owner org's capacity-manager key.
    owner: Client,
    /// The managing org's capacity-manager key.
    manager: Client,
    /// A member key of the audience org (places VMs, holds no reservation.capacity).
    audience: Client,
    /// A member key of an org with no part in the reservation.
    outsider: Client,
}

impl World {
    fn open() -> World {
        let scene = Scenario::new()
            .orgs(&[OWNER, AUDIENCE, MANAGER, OUTSIDER])
            .node(NODE, OWNER, &UNITS)
            .reservation(
                "r",
                ReservationSpec::on(NODE, &RESERVED)
                    .audience(&[AUDIENCE])
                    .managers(&[MANAGER])
                    .ends_in(86_400)
                    .contract_ref("contract-7")
                    .reason("quarterly commitment"),
            )
            .key("owner", OWNER, "capacity-manager")
            .key("manager", MANAGER, "capacity-manager")
            .key("audience", AUDIENCE, "member")
            .key("outsider", OUTSIDER, "member")
            .open();
        World {
            reservation_id: scene.reservation_id("r"),
            owner: scene.client("owner"),
            manager: scene.client("manager"),
            audience: scene.client("audience"),
            outsider: scene.client("outsider"),
            app: scene.app,
        }
    }

    fn path(&self) -> String {
        format!("/v1/nodes/{NODE}/reservations/{}", self.reservation_id)
    }

    fn call(&self, client: &Client, op: Op, units: &[&str]) -> Reply {
        client.post(
            &format!("{}/{}", self.path(), op.suffix()),
            &json!({ "unitIds": units, "reason": format!("{} by test", op.suffix()) }),
        )
    }

    /// A successful call by the node's owner.
    #[track_caller]
    fn ok(&self, op: Op, units: &[&str]) -> Value {
        self.call(&self.owner, op, units).expect_status(200).json()
    }

    fn reservation(&self) -> Value {
        self.app
            .operator()
            .get(&self.path())
            .expect_status(200)
            .json()
    }

    fn released(&self) -> Vec<String> {
        strings(&self.reservation()["releasedUnitIds"])
    }

    fn vm(&self, id: &str) -> Value {
        self.app
            .operator()
            .get(&format!("/v1/vms/{id}"))
            .expect_status(200)
            .json()
    }

    fn audit_count(&self) -> i64 {
        self.app
            .db()
            .query_row("SELECT count(*) FROM audit_events", [], |r| r.get(0))
            .expect("count")
    }

    /// The latest audit event: (action, actor org, unit ids, terminated, skipped, reason).
    fn last_event(&self) -> (String, Option<String>, Value, Value, Value, Option<String>) {
        self.app
            .db()
            .query_row(
                "SELECT action, actor_org_id, unit_ids, terminated, skipped, reason \
                 FROM audit_events WHERE node_id = ?1 ORDER BY seq DESC LIMIT 1",
                [NODE],
                |r| {
                    let list = |i: usize| -> rusqlite::Result<Value> {
                        let text: String = r.get(i)?;
                        Ok(serde_json::from_str(&text).expect("a JSON list"))
                    };
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        list(2)?,
                        list(3)?,
                        list(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .expect("an event")
    }

    /// Every row of every table of the app's database and key-value store, but what the
    /// store remembers of its site (a cache any request may refresh, which decides nothing).
    fn snapshot(&self) -> Vec<String> {
        let mut dump: Vec<String> = self
            .app
            .database_paths()
            .into_iter()
            .flat_map(dump_database)
            .collect();
        dump.extend(self.app.key_value_dump());
        dump.retain(|row| !row.contains("/forwards-writes"));
        // An org's write-share counter at 0 is every turn of its window given back, whichever
        // 10 s window a write fell in: bookkeeping, not state (a turn never given back, a
        // counter above 0, still shows).
        dump.retain(|row| !(row.starts_with("redis: write-share/") && row.ends_with(" = 0")));
        dump
    }
}

fn dump_database(path: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open(path).expect("open");
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    let mut dump = vec![format!("{}: user_version {version}", path.display())];
    let tables: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("tables")
        .collect::<Result<_, _>>()
        .expect("names");
    for table in ["sqlite_master".to_owned()].iter().chain(&tables) {
        let mut statement = db
            .prepare(&format!("SELECT * FROM \"{table}\""))
            .expect("select");
        let width = statement.column_count();
        let mut rows: Vec<String> = statement
            .query_map([], |r| {
                (0..width)
                    .map(|i| {
                        r.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| format!("{table}: {}", values.join(" | ")))
            })
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("values");
        rows.sort();
        dump.extend(rows);
    }
    dump
}

/// Asserts two snapshots are equal, showing only the rows that differ.
#[track_caller]
fn assert_same_state(before: &[String], after: &[String], why: &str) {
    let before_rows: BTreeSet<&String> = before.iter().collect();
    let after_rows: BTreeSet<&String> = after.iter().collect();
    let gone: Vec<&&String> = before_rows.difference(&after_rows).collect();
    let new: Vec<&&String> = after_rows.difference(&before_rows).collect();
    assert!(
        gone.is_empty() && new.is_empty() && before.len() == after.len(),
        "{why}: rows gone {gone:#?}, rows new {new:#?}"
    );
}

fn members(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .cloned()
        .collect()
}

/// A problem document without the members that differ on every request.
fn without_request_identity(mut problem: Value) -> Value {
    let object = problem.as_object_mut().expect("a problem object");
    object.remove("requestId");
    object.remove("instance");
    problem
}

// ------------------------------------------------------------------------ responses

#[test]
fn responses_carry_the_v1_contracts_fields_exactly() {
    let world = World::open();
    let created = world.reservation();
    let reservation_fields: BTreeSet<String> =
        RESERVATION_FIELDS.iter().map(|f| f.to_string()).collect();
    assert_eq!(members(&created), reservation_fields);

    let released = world.ok(Op::Release, &["g2", "g1"]);
    assert_eq!(members(&released), reservation_fields);
    assert_eq!(released["releasedUnitIds"], json!(["g1", "g2"]));
    assert_eq!(released["reservedUnitIds"], json!(RESERVED));
    assert_eq!(released["status"], "active");
    // The release's reason goes to the audit trail; the reservation keeps its own.
    assert_eq!(released["reason"], "quarterly commitment");
    for unchanged in [
        "id",
        "nodeId",
        "allowedOrgIds",
        "managingOrgIds",
        "startsAt",
        "endsAt",
        "contractRef",
        "topologyGen",
        "createdAt",
    ] {
        assert_eq!(released[unchanged], created[unchanged], "{unchanged}");
    }
    let read = world.reservation();
    assert_eq!(
        released, read,
        "the release answers the reservation as a read does"
    );

    let dry_run = world.ok(Op::DryRun, &["g1"]);
    let mut dry_run_fields = reservation_fields.clone();
    dry_run_fields.extend(["wouldTerminate".to_owned(), "wouldSkip".to_owned()]);
    assert_eq!(members(&dry_run), dry_run_fields);
    assert_eq!(dry_run["wouldTerminate"], json!([]));
    assert_eq!(dry_run["wouldSkip"], json!([]));
    assert_eq!(dry_run["releasedUnitIds"], json!(["g1", "g2"]), "unchanged");

    let reclaimed = world.ok(Op::Reclaim, &["g1"]);
    let mut reclaim_fields = reservation_fields.clone();
    reclaim_fields.extend(["terminated".to_owned(), "skipped".to_owned()]);
    assert_eq!(members(&reclaimed), reclaim_fields);
    assert_eq!(reclaimed["terminated"], json!([]));
    assert_eq!(reclaimed["skipped"], json!([]));
    assert_eq!(reclaimed["releasedUnitIds"], json!(["g2"]));
    assert_eq!(reclaimed["reason"], "quarterly commitment");

    // An open-ended reservation without contract or reason leaves those fields out.
    let plain = world.app.reservation(NODE, &["g4"], &[AUDIENCE], &[]);
    let path = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        plain["id"].as_str().unwrap()
    );
    let released = world
        .owner
        .post(&format!("{path}/release"), &json!({ "unitIds": ["g4"] }))
        .expect_status(200)
        .json();
    let mut plain_fields = reservation_fields.clone();
    for absent in ["endsAt", "contractRef", "reason"] {
        plain_fields.remove(absent);
    }
    assert_eq!(members(&released), plain_fields);
}

// ------------------------------------------------------------------------ who may call

#[test]
fn operators_node_owners_and_managing_orgs_may_call_all_three() {
    let world = World::open();
    let app = &world.app;
    let callers = [
        ("operator", app.operator(), None),
        ("owner capacity-manager", world.owner.clone(), Some(OWNER)),
        ("owner admin", app.key(OWNER, "admin", None), Some(OWNER)),
        (
            "owner key narrowed to reservation.capacity",
            app.key(OWNER, "admin", Some(&["reservation.capacity"])),
            Some(OWNER),
        ),
        (
            "manager capacity-manager",
            world.manager.clone(),
            Some(MANAGER),
        ),
        (
            "manager key narrowed to reservation.capacity",
            app.key(MANAGER, "capacity-manager", Some(&["reservation.capacity"])),
            Some(MANAGER),
        ),
    ];
    for (who, client, org) in &callers {
        for op in Op::ALL {
            let reply = world.call(client, op, &["g1"]);
            assert_eq!(reply.status, 200, "{who} {op:?}: {}", reply.text());
            if op != Op::DryRun {
                let (action, actor_org, units, _, _, reason) = world.last_event();
                let expected_action = match op {
                    Op::Release => "reservation.release",
                    _ => "reservation.reclaim",
                };
                assert_eq!(action, expected_action, "{who}");
                assert_eq!(actor_org.as_deref(), *org, "{who}");
                assert_eq!(units, json!(["g1"]));
                assert_eq!(
                    reason.as_deref(),
                    Some(format!("{} by test", op.suffix()).as_str())
                );
            }
        }
    }
}

/// A key without reservation.capacity, a missing reservation, a reservation under another
/// node, and an org that cannot see the reservation all get the very same 404.
#[test]
fn everyone_else_gets_the_same_404_as_for_a_missing_reservation() {
    let world = World::open();
    let app = &world.app;
    app.node("n2", OWNER, &["h0"]);
    let refused_callers = [
        (
            "owner member (no reservation.capacity)",
            app.key(OWNER, "member", None),
        ),
        ("owner viewer", app.key(OWNER, "viewer", None)),
        (
            "owner admin narrowed to reservation.write",
            app.key(
                OWNER,
                "admin",
                Some(&["reservation.read", "reservation.write"]),
            ),
        ),
        ("manager viewer", app.key(MANAGER, "viewer", None)),
        ("audience member", world.audience.clone()),
        (
            "audience admin narrowed without capacity",
            app.key(AUDIENCE, "admin", Some(&["vm.write"])),
        ),
        (
            "outsider admin (holds reservation.capacity)",
            app.key(OUTSIDER, "admin", None),
        ),
        ("outsider member", world.outsider.clone()),
    ];
    let before = world.snapshot();
    for op in Op::ALL {
        let missing = world
            .owner
            .post(
                &format!("/v1/nodes/{NODE}/reservations/rsv-missing/{}", op.suffix()),
                &json!({ "unitIds": ["g1"] }),
            )
            .expect_problem(404, "not-found");
        let wrong_node = world
            .owner
            .post(
                &format!(
                    "/v1/nodes/n2/reservations/{}/{}",
                    world.reservation_id,
                    op.suffix()
                ),
                &json!({ "unitIds": ["g1"] }),
            )
            .expect_problem(404, "not-found");
        let unknown_node = world
            .owner
            .post(
                &format!(
                    "/v1/nodes/n9/reservations/{}/{}",
                    world.reservation_id,
                    op.suffix()
                ),
                &json!({ "unitIds": ["g1"] }),
            )
            .expect_problem(404, "not-found");
        let hidden = without_request_identity(missing);
        assert_eq!(
            without_request_identity(wrong_node),
            hidden,
            "{op:?} wrong nodeId"
        );
        assert_eq!(
            without_request_identity(unknown_node),
            hidden,
            "{op:?} unknown node"
        );

        for (who, client) in &refused_callers {
            // Even requests that would be invalid are hidden behind the 404.
            for units in [json!(["g1"]), json!(["g1", "g1"]), json!(["zz"]), json!([])] {
                let problem = client
                    .post(
                        &format!("{}/{}", world.path(), op.suffix()),
                        &json!({ "unitIds": units }),
                    )
                    .expect_problem(404, "not-found");
                assert_eq!(
                    without_request_identity(problem),
                    hidden,
                    "{who} {op:?} {units}"
                );
            }
        }
        app.anonymous()
            .post(
                &format!("{}/{}", world.path(), op.suffix()),
                &json!({ "unitIds": ["g1"] }),
            )
            .expect_problem(401, "unauthorized");
    }
    assert_same_state(&before, &world.snapshot(), "no refused call wrote anything");
}

/// The audience sees the reservation (it may read it), so an audience key that holds
/// reservation.capacity is told it may not manage it rather than that it does not exist.
#[test]
fn the_audience_may_read_but_not_manage_the_reservation() {
    let world = World::open();
    let audience_admin = world.app.key(AUDIENCE, "admin", None);
    audience_admin.get(&world.path()).expect_status(200);
    let before = world.snapshot();
    for op in Op::ALL {
        world
            .call(&audience_admin, op, &["g1"])
            .expect_problem(403, "forbidden");
    }
    assert_same_state(&before, &world.snapshot(), "a refused call writes nothing");
}

// ------------------------------------------------------------------------ status

#[test]
fn only_an_active_reservation_inside_its_term_may_change() {
    let world = World::open();
    let app = &world.app;
    let create = |units: &[&str], starts: i64, ends: Option<i64>| -> String {
        let mut body = json!({
            "reservedUnitIds": units,
            "allowedOrgIds": [AUDIENCE],
            "managingOrgIds": [MANAGER],
            "startsAt": rfc3339_from_now(starts),
        });
        if let Some(ends) = ends {
            body["endsAt"] = json!(rfc3339_from_now(ends));
        }
        let reservation = app
            .operator()
            .post(&format!("/v1/nodes/{NODE}/reservations"), &body)
            .expect_status(201)
            .json();
        reservation["id"].as_str().unwrap().to_owned()
    };
    let pending = create(&["g4"], 7 * 86_400, None);
    let expiring = create(&["g5"], -3600, Some(3600));
    let cancelled = create(&["g6"], -3600, None);
    app.operator()
        .post(
            &format!("/v1/nodes/{NODE}/reservations/{cancelled}/cancel"),
            &json!({}),
        )
        .expect_status(200);
    // A second node whose reservation the topology change withholds for review.
    app.node("n2", OWNER, &["h0", "h1"]);
    let withheld = app.reservation("n2", &["h0"], &[AUDIENCE], &[MANAGER])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.operator()
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": OWNER, "unitIds": ["h0", "h1", "h2"] }),
        )
        .expect_status(200);
    // The expiring reservation may still change while inside its term.
    world
        .owner
        .post(
            &format!("/v1/nodes/{NODE}/reservations/{expiring}/release"),
            &json!({ "unitIds": ["g5"] }),
        )
        .expect_status(200);
    app.set_clock_offset_secs(2 * 3600);

    let before = world.snapshot();
    let cases = [
        (NODE, &pending, "g4", "pending"),
        (NODE, &expiring, "g5", "expired"),
        (NODE, &cancelled, "g6", "cancelled"),
        ("n2", &withheld, "h0", "needs-review"),
    ];
    for (node, id, unit, status) in cases {
        for op in Op::ALL {
            for client in [&world.owner, &world.manager, &app.operator()] {
                let problem = client
                    .post(
                        &format!("/v1/nodes/{node}/reservations/{id}/{}", op.suffix()),
                        &json!({ "unitIds": [unit] }),
                    )
                    .expect_problem(409, "reservation-not-active");
                assert_eq!(problem["reservationStatus"], status, "{op:?}");
                assert!(problem["detail"].as_str().unwrap().contains(status));
            }
        }
    }
    assert_same_state(&before, &world.snapshot(), "no refused call wrote anything");
    // The expired reservation's released unit stays as it was; the main one still works.
    world.ok(Op::Release, &["g0"]);
}

// ------------------------------------------------------------------------ the unit list

#[test]
fn the_unit_list_must_be_a_bounded_non_repeating_subset_of_the_reservation() {
    let world = World::open();
    let before = world.snapshot();
    let post = |op: Op, body: Value| {
        world
            .owner
            .post(&format!("{}/{}", world.path(), op.suffix()), &body)
    };
    for op in Op::ALL {
        // Strangers: units of the node outside the reservation, of no node, or not ids at all.
        let problem = post(
            op,
            json!({ "unitIds": ["g1", "g5", "zz", "g2", "not an id"] }),
        )
        .expect_problem(422, "units-not-in-reservation");
        assert_eq!(
            problem["unitIds"],
            json!(["g5", "zz", "not an id"]),
            "{op:?}"
        );

        let problem = post(op, json!({ "unitIds": ["g1", "g2", "g1", "g3", "g2"] }))
            .expect_problem(422, "duplicate-ids");
        assert_eq!(problem["field"], "unitIds");
        assert_eq!(problem["ids"], json!(["g1", "g2"]));

        let problem = post(op, json!({ "unitIds": [] })).expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "unitIds");

        let too_many: Vec<String> = (0..1025).map(|i| format!("u{i}")).collect();
        let problem = post(op, json!({ "unitIds": too_many })).expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "unitIds");
        assert!(
            problem["detail"].as_str().unwrap().contains("1024"),
            "{problem}"
        );
        // 1024 is within bounds: the list is then checked against the reservation.
        let problem = post(op, json!({ "unitIds": too_many[..1024] }))
            .expect_problem(422, "units-not-in-reservation");
        assert_eq!(problem["unitIds"].as_array().unwrap().len(), 1024);

        let problem = post(op, json!({ "unitIds": ["g1"], "reason": "x".repeat(1025) }))
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "reason");

        let problem =
            post(op, json!({ "reason": "no units" })).expect_problem(400, "missing-field");
        assert_eq!(problem["field"], "unitIds");
        post(op, json!({ "unitIds": ["g1"], "force": true })).expect_problem(400, "unknown-field");
        post(op, json!({ "unitIds": "g1" })).expect_problem(400, "invalid-type");
        let path = format!("{}/{}", world.path(), op.suffix());
        world
            .owner
            .send(
                "POST",
                &path,
                Some("application/json"),
                Some(b"{\"unitIds\": [\"g1\""),
            )
            .expect_problem(400, "malformed-json");
        world
            .owner
            .send(
                "POST",
                &path,
                Some("text/plain"),
                Some(b"{\"unitIds\": [\"g1\"]}"),
            )
            .expect_problem(415, "unsupported-media-type");
    }
    assert_same_state(&before, &world.snapshot(), "no refused call wrote anything");
}
