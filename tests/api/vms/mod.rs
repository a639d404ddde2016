//! VMs over HTTP: every placement rule and refusal reason, the double-sell story, who sees
//! and who stops a VM, and the invariants that the database itself enforces whatever the
//! interleaving of requests (checked by writing to the app's SQLite file directly).

use std::collections::BTreeSet;
use std::sync::Barrier;

use serde_json::{Value, json};

use api_support::{
    App, Client, Reply, ReservationSpec, Scenario, at_once, place_vm, placed_vm, rfc3339_from_now,
    sorted, strings,
};

mod database;
mod need_to_know;
mod reads;
mod termination;

const NODE: &str = "n1";
const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
/// A second audience org: in the audience, but not the VM's org.
const OTHER_AUDIENCE: &str = "aud2";
const MANAGER: &str = "mgr";
const OUTSIDER: &str = "spotco";
const UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];
/// The main reservation's units; g4..g7 are reserved by nobody.
const RESERVED: [&str; 4] = ["g0", "g1", "g2", "g3"];

/// A node `n1` of `owner` with units g0..g7, and an active open-ended reservation of g0..g3
/// for the audience `aud`, `aud2`, managed on the owner's behalf by `mgr`.
struct Market {
    app: App,
    reservation_id: String,
    /// The owner org's capacity-manager key (reservation.capacity, vm.read, no vm.write).
    owner: Client,
    /// A member key of the audience org.
    audience: Client,
    /// A member key of the other audience org.
    other_audience: Client,
    /// The managing org's capacity-manager key.
    manager: Client,
    /// A member key of an org that has no part in the reservation.
    outsider: Client,
}

impl Market {
    fn open() -> Market {
        let scene = Scenario::new()
            .orgs(&[OWNER, AUDIENCE, OTHER_AUDIENCE, MANAGER, OUTSIDER])
            .node(NODE, OWNER, &UNITS)
            .reservation(
                "r",
                ReservationSpec::on(NODE, &RESERVED)
                    .audience(&[AUDIENCE, OTHER_AUDIENCE])
                    .managers(&[MANAGER]),
            )
            .key("owner", OWNER, "capacity-manager")
            .key("audience", AUDIENCE, "member")
            .key("other audience", OTHER_AUDIENCE, "member")
            .key("manager", MANAGER, "capacity-manager")
            .key("outsider", OUTSIDER, "member")
            .open();
        Market {
            reservation_id: scene.reservation_id("r"),
            owner: scene.client("owner"),
            audience: scene.client("audience"),
            other_audience: scene.client("other audience"),
            manager: scene.client("manager"),
            outsider: scene.client("outsider"),
            app: scene.app,
        }
    }

    fn reservation_path(&self) -> String {
        format!("/v1/nodes/{NODE}/reservations/{}", self.reservation_id)
    }

    /// Puts units of the main reservation on the spot market (as the node's owner).
    fn release(&self, units: &[&str]) -> Value {
        self.owner
            .post(
                &format!("{}/release", self.reservation_path()),
                &json!({ "unitIds": units, "reason": "idle tonight" }),
            )
            .expect_status(200)
            .json()
    }

    /// Rows of `vm_units` that are running, as (unit, vm, tier), sorted.
    fn running_units(&self) -> Vec<(String, String, String)> {
        let db = self.app.db();
        let mut statement = db
            .prepare("SELECT unit_id, vm_id, tier FROM vm_units WHERE running = 1 ORDER BY unit_id")
            .expect("prepare");
        statement
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    fn vm_count(&self) -> i64 {
        self.app
            .db()
            .query_row("SELECT count(*) FROM vms", [], |r| r.get(0))
            .expect("count")
    }
}

/// The refused units of a 409 `placement-refused`, as (unitId, reason) in the problem's order.
#[track_caller]
fn refusals(reply: Reply) -> Vec<(String, String)> {
    let problem = reply.expect_problem(409, "placement-refused");
    problem["refusals"]
        .as_array()
        .unwrap_or_else(|| panic!("refusals is not a list: {problem}"))
        .iter()
        .map(|refusal| {
            let members: BTreeSet<&str> = refusal
                .as_object()
                .expect("a refusal is an object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(members, BTreeSet::from(["unitId", "reason"]), "{refusal}");
            (
                refusal["unitId"].as_str().expect("unitId").to_owned(),
                refusal["reason"].as_str().expect("reason").to_owned(),
            )
        })
        .collect()
}

fn refused(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(unit, reason)| (unit.to_string(), reason.to_string()))
        .collect()
}

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a page: {list}"))
        .iter()
        .map(|vm| vm["id"].as_str().expect("id").to_owned())
        .collect();
    ids.sort();
    ids
}

// ------------------------------------------------------------------------ placement

#[test]
fn a_vm_on_free_units_is_placed_and_its_units_are_then_busy() {
    let market = Market::open();
    let reply = market.outsider.post(
        "/v1/vms",
        &json!({ "nodeId": NODE, "unitIds": ["g5", "g4"], "tier": "community" }),
    );
    let location = reply.header("location").map(str::to_owned);
    let vm = reply.expect_status(201).json();
    let id = vm["id"].as_str().expect("id").to_owned();
    assert_eq!(location, Some(format!("/v1/vms/{id}")));
    let members: BTreeSet<&str> = vm.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        members,
        BTreeSet::from([
            "id",
            "orgId",
            "nodeId",
            "unitIds",
            "tier",
            "status",
            "createdAt"
        ])
    );
    assert_server_generated(&id);
    assert_eq!(vm["orgId"], OUTSIDER);
    assert_eq!(vm["nodeId"], NODE);
    assert_eq!(vm["unitIds"], json!(["g5", "g4"]));
    assert_eq!(vm["tier"], "community");
    assert_eq!(vm["status"], "running");
    let read = market
        .outsider
        .get(&format!("/v1/vms/{id}"))
        .expect_status(200)
        .json();
    assert_eq!(read, vm);

    // A unit runs at most one VM: g4 is busy, whoever asks and at whatever tier, and a
    // refused request places nothing, not even on its free units.
    for (client, tier) in [
        (&market.outsider, "spot"),
        (&market.audience, "verified"),
        (&market.other_audience, "community"),
    ] {
        assert_eq!(
            refusals(place_vm(client, NODE, &["g6", "g4"], tier)),
            refused(&[("g4", "unit-busy")])
        );
    }
    assert_eq!(market.vm_count(), 1);
    // Every placement gets an id of its own.
    let second = placed_vm(&market.audience, NODE, &["g6"], "spot");
    assert_server_generated(&second);
    assert_ne!(second, id);
}

/// `vm-` and at least 64 bits of lower-case hex: an id that nobody chose.
#[track_caller]
fn assert_server_generated(id: &str) {
    let hex = id
        .strip_prefix("vm-")
        .unwrap_or_else(|| panic!("{id} is not vm-<hex>"));
    assert!(
        hex.len() >= 16
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id} is not vm-<random hex>"
    );
}

/// VM ids are the server's: a client cannot pick one, so it cannot probe whether another org
/// uses an id (were ids chosen by clients, a clash would answer 409 `already-exists` where a
/// free id answers 201).
#[test]
fn a_vm_id_in_the_body_is_refused_and_orgs_never_learn_each_others_ids() {
    let market = Market::open();
    // The other org's VM, whose id the outsider should not be able to confirm.
    let theirs = placed_vm(&market.audience, NODE, &["g4"], "community");
    for id in [theirs.as_str(), "vm-mine", "not a valid id"] {
        let problem = market
            .outsider
            .post(
                "/v1/vms",
                &json!({ "id": id, "nodeId": NODE, "unitIds": ["g5"], "tier": "spot" }),
            )
            .expect_problem(400, "unknown-field");
        assert_eq!(problem["field"], "id", "{problem}");
    }
    // The same answer whether or not the id is taken, and nothing was placed.
    assert_eq!(market.vm_count(), 1);

    // Two orgs placing side by side: every id is fresh and seen only by its own org.
    let mut mine = BTreeSet::from([theirs.clone()]);
    let mut outsiders = BTreeSet::new();
    for unit in ["g5", "g6", "g7"] {
        let id = placed_vm(&market.outsider, NODE, &[unit], "spot");
        assert_server_generated(&id);
        assert!(outsiders.insert(id.clone()) && !mine.contains(&id));
    }
    for unit in ["g0", "g1"] {
        let id = placed_vm(&market.audience, NODE, &[unit], "community");
        assert!(mine.insert(id.clone()) && !outsiders.contains(&id));
    }
    let listed = |client: &Client| -> BTreeSet<String> {
        ids(&client.get("/v1/vms").expect_status(200).json())
            .into_iter()
            .collect()
    };
    assert_eq!(listed(&market.outsider), outsiders);
    assert_eq!(listed(&market.audience), mine);
    // Each org gets 404 for the other's VMs, the same answer as for an id nobody uses.
    let missing = market
        .outsider
        .get("/v1/vms/vm-0000000000000000")
        .expect_problem(404, "not-found");
    for id in &mine {
        let problem = market
            .outsider
            .get(&format!("/v1/vms/{id}"))
            .expect_problem(404, "not-found");
        assert_eq!(problem["detail"], missing["detail"], "{problem}");
    }
    for id in &outsiders {
        market
            .audience
            .get(&format!("/v1/vms/{id}"))
            .expect_problem(404, "not-found");
    }
}

#[test]
fn placing_needs_an_org_key_with_vm_write_and_a_well_formed_request() {
    let market = Market::open();
    let app = &market.app;
    let body = json!({ "nodeId": NODE, "unitIds": ["g4"], "tier": "spot" });
    app.anonymous()
        .post("/v1/vms", &body)
        .expect_problem(401, "unauthorized");
    // Operators have no org to run a workload for; viewers and capacity managers lack vm.write.
    app.operator()
        .post("/v1/vms", &body)
        .expect_problem(403, "forbidden");
    app.key(AUDIENCE, "viewer", None)
        .post("/v1/vms", &body)
        .expect_problem(403, "forbidden");
    market
        .owner
        .post("/v1/vms", &body)
        .expect_problem(403, "forbidden");
    app.key(AUDIENCE, "admin", Some(&["vm.read"]))
        .post("/v1/vms", &body)
        .expect_problem(403, "forbidden");

    let place_body = |body: Value| market.audience.post("/v1/vms", &body);
    place_body(json!({ "nodeId": "no-such-node", "unitIds": ["g4"], "tier": "spot" }))
        .expect_problem(404, "not-found");
    let problem = place_body(json!({ "nodeId": NODE, "unitIds": ["g4"], "tier": "premium" }))
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "tier");
    let problem = place_body(json!({ "nodeId": NODE, "unitIds": [], "tier": "spot" }))
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "unitIds");
    let problem =
        place_body(json!({ "nodeId": NODE, "unitIds": ["g4", "g5", "g4"], "tier": "spot" }))
            .expect_problem(422, "duplicate-ids");
    assert_eq!(problem["ids"], json!(["g4"]));
    place_body(json!({ "nodeId": NODE, "unitIds": ["g4"], "tier": "spot", "gpus": 8 }))
        .expect_problem(400, "unknown-field");
    assert_eq!(market.vm_count(), 0);
    // The same request from a key that may place it succeeds.
    market.audience.post("/v1/vms", &body).expect_status(201);
}

#[test]
fn units_not_on_the_node_are_refused_by_name() {
    let market = Market::open();
    assert_eq!(
        refusals(place_vm(
            &market.outsider,
            NODE,
            &["g4", "zz", "g9"],
            "spot"
        )),
        refused(&[("zz", "unknown-unit"), ("g9", "unknown-unit")])
    );
    assert_eq!(market.vm_count(), 0);
}

#[test]
fn reserved_units_that_are_not_released_take_only_the_audience() {
    let market = Market::open();
    let app = &market.app;
    // Outsiders are refused at every tier, told only that the unit is not available to them;
    // so are the managing org and the node's owner, which manage the reservation but are not
    // its audience (they may see it, and are told why).
    for tier in ["spot", "community", "verified"] {
        assert_eq!(
            refusals(place_vm(&market.outsider, NODE, &["g0", "g4"], tier)),
            refused(&[("g0", "unavailable")])
        );
    }
    assert_eq!(
        refusals(place_vm(
            &app.key(MANAGER, "admin", None),
            NODE,
            &["g1"],
            "community"
        )),
        refused(&[("g1", "reserved-for-audience")])
    );
    assert_eq!(
        refusals(place_vm(
            &app.key(OWNER, "admin", None),
            NODE,
            &["g1", "g2"],
            "spot"
        )),
        refused(&[
            ("g1", "reserved-for-audience"),
            ("g2", "reserved-for-audience")
        ])
    );
    // Every org of the audience may place any tier.
    placed_vm(&market.audience, NODE, &["g0"], "verified");
    placed_vm(&market.other_audience, NODE, &["g1", "g2"], "community");
    placed_vm(&market.audience, NODE, &["g3"], "spot");
    assert_eq!(market.running_units().len(), 4);
}

#[test]
fn released_units_take_spot_only_from_anyone() {
    let market = Market::open();
    market.release(&["g1", "g2"]);
    for tier in ["community", "verified"] {
        assert_eq!(
            refusals(place_vm(&market.audience, NODE, &["g0", "g1", "g2"], tier)),
            refused(&[("g1", "released-spot-only"), ("g2", "released-spot-only")])
        );
        assert_eq!(
            refusals(place_vm(&market.outsider, NODE, &["g0", "g1", "g2"], tier)),
            refused(&[
                ("g0", "unavailable"),
                ("g1", "released-spot-only"),
                ("g2", "released-spot-only"),
            ])
        );
    }
    placed_vm(&market.outsider, NODE, &["g1"], "spot");
    placed_vm(&market.audience, NODE, &["g2"], "spot");
    let running = market.running_units();
    assert_eq!(running.len(), 2);
    assert!(running.iter().all(|(_, _, tier)| tier == "spot"));
}

#[test]
fn units_of_a_needs_review_reservation_are_withheld_from_everyone() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g3"]);
    // A new unit changes the node's topology: the reservation is withheld for review.
    let mut units = UNITS.to_vec();
    units.push("g8");
    let node = app
        .operator()
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": OWNER, "unitIds": units }),
        )
        .expect_status(200)
        .json();
    assert_eq!(
        node["withheldReservationIds"],
        json!([market.reservation_id])
    );
    let reservation = app
        .operator()
        .get(&market.reservation_path())
        .expect_status(200)
        .json();
    assert_eq!(reservation["status"], "needs-review");

    for (client, tier, reason) in [
        (&market.audience, "community", "withheld-needs-review"),
        (&market.audience, "spot", "withheld-needs-review"),
        (&market.outsider, "spot", "unavailable"),
        (&market.other_audience, "verified", "withheld-needs-review"),
    ] {
        assert_eq!(
            refusals(place_vm(client, NODE, &["g0", "g3", "g8"], tier)),
            refused(&[("g0", reason), ("g3", reason)])
        );
    }
    assert_eq!(market.vm_count(), 0);
    // Units outside it, old and new, are anyone's.
    placed_vm(&market.outsider, NODE, &["g4", "g8"], "community");

    // Once an operator re-affirms it, the audience may use its units again.
    app.operator()
        .post(
            &format!("{}/reaffirm", market.reservation_path()),
            &json!({}),
        )
        .expect_status(200);
    placed_vm(&market.audience, NODE, &["g0"], "community");
    assert_eq!(
        refusals(place_vm(&market.outsider, NODE, &["g1", "g3"], "community")),
        refused(&[("g1", "unavailable"), ("g3", "released-spot-only")])
    );
}

#[test]
fn units_of_a_future_reservation_take_spot_only_until_its_term_starts() {
    let market = Market::open();
    let app = &market.app;
    let future = app.make_reservation(
        &ReservationSpec::on(NODE, &["g4", "g5"])
            .audience(&[AUDIENCE])
            .starts_in(3600),
    );
    assert_eq!(future["status"], "pending");
    for (client, tier, reason) in [
        (
            &market.audience,
            "community",
            "future-reservation-spot-only",
        ),
        (&market.audience, "verified", "future-reservation-spot-only"),
        (&market.outsider, "community", "unavailable"),
    ] {
        assert_eq!(
            refusals(place_vm(client, NODE, &["g4", "g5", "g6"], tier)),
            refused(&[("g4", reason), ("g5", reason)])
        );
    }
    // Spot capacity before the term starts, reclaimable when it does.
    placed_vm(&market.outsider, NODE, &["g4"], "spot");

    app.set_clock_offset_secs(2 * 3600);
    assert_eq!(
        refusals(place_vm(&market.outsider, NODE, &["g5"], "spot")),
        refused(&[("g5", "unavailable")])
    );
    placed_vm(&market.audience, NODE, &["g5"], "community");
}

#[test]
fn expired_and_cancelled_reservations_restrict_nothing() {
    let market = Market::open();
    let app = &market.app;
    app.operator()
        .post(
            &format!("/v1/nodes/{NODE}/reservations"),
            &json!({
                "reservedUnitIds": ["g4", "g5"],
                "allowedOrgIds": [AUDIENCE],
                "startsAt": rfc3339_from_now(-3600),
                "endsAt": rfc3339_from_now(3600),
            }),
        )
        .expect_status(201);
    market.release(&["g3"]);
    assert_eq!(
        refusals(place_vm(&market.outsider, NODE, &["g4", "g2"], "community")),
        refused(&[("g4", "unavailable"), ("g2", "unavailable")])
    );
    app.operator()
        .post(&format!("{}/cancel", market.reservation_path()), &json!({}))
        .expect_status(200);
    app.set_clock_offset_secs(2 * 3600);
    // Expired (g4, g5) and cancelled (g0..g3, released or not): anyone, any tier.
    placed_vm(&market.outsider, NODE, &["g4", "g2"], "community");
    placed_vm(&market.outsider, NODE, &["g3"], "verified");
    placed_vm(&market.other_audience, NODE, &["g5", "g0"], "spot");
}

#[test]
fn every_refused_unit_is_named_with_its_own_reason() {
    let market = Market::open();
    let app = &market.app;
    // g0..g3: withheld for review (the node gained g8 after the main reservation was made).
    let mut units = UNITS.to_vec();
    units.extend(["g8", "g9"]);
    app.operator()
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": OWNER, "unitIds": units }),
        )
        .expect_status(200);
    // g4, g5: an active reservation for the audience, g5 on the spot market.
    let current = app.reservation(NODE, &["g4", "g5"], &[AUDIENCE], &[]);
    market
        .owner
        .post(
            &format!(
                "/v1/nodes/{NODE}/reservations/{}/release",
                current["id"].as_str().unwrap()
            ),
            &json!({ "unitIds": ["g5"] }),
        )
        .expect_status(200);
    // g8: a reservation whose term has not started.
    app.operator()
        .post(
            &format!("/v1/nodes/{NODE}/reservations"),
            &json!({
                "reservedUnitIds": ["g8"],
                "allowedOrgIds": [OUTSIDER],
                "startsAt": rfc3339_from_now(3600),
            }),
        )
        .expect_status(201);
    // g6: busy.
    placed_vm(&market.audience, NODE, &["g6"], "spot");

    let before = market.vm_count();
    assert_eq!(
        refusals(place_vm(
            &market.outsider,
            NODE,
            &["g7", "g6", "g5", "g4", "g0", "zz", "g8", "g9"],
            "community"
        )),
        refused(&[
            ("g6", "unit-busy"),
            ("g5", "released-spot-only"),
            ("g4", "unavailable"),
            ("g0", "unavailable"),
            ("zz", "unknown-unit"),
            ("g8", "future-reservation-spot-only"),
        ])
    );
    assert_eq!(
        market.vm_count(),
        before,
        "a refused request places nothing"
    );
    placed_vm(&market.outsider, NODE, &["g7", "g9"], "community");
}

/// The spot market's story: release → a spot VM placed by an outsider → a community request refused
/// on the same units → an audience VM placed on a unit that is not released.
#[test]
fn double_sell_story() {
    let market = Market::open();
    let released = market.release(&["g1", "g2", "g3"]);
    assert_eq!(
        strings(&released["releasedUnitIds"]),
        sorted(["g1", "g2", "g3"])
    );

    let spot = placed_vm(&market.outsider, NODE, &["g1", "g2"], "spot");
    assert_eq!(
        refusals(place_vm(
            &market.outsider,
            NODE,
            &["g1", "g2", "g3"],
            "community"
        )),
        refused(&[
            ("g1", "unit-busy"),
            ("g2", "unit-busy"),
            ("g3", "released-spot-only"),
        ])
    );
    // The audience itself buys released units at tier=spot only.
    assert_eq!(
        refusals(place_vm(&market.audience, NODE, &["g3"], "verified")),
        refused(&[("g3", "released-spot-only")])
    );
    let audience_vm = placed_vm(&market.audience, NODE, &["g0"], "community");

    let running = market.running_units();
    assert_eq!(
        running,
        vec![
            ("g0".into(), audience_vm.clone(), "community".into()),
            ("g1".into(), spot.clone(), "spot".into()),
            ("g2".into(), spot.clone(), "spot".into()),
        ]
    );
    let spot_vm = market
        .owner
        .get(&format!("/v1/vms/{spot}"))
        .expect_status(200)
        .json();
    assert_eq!(spot_vm["tier"], "spot");
    assert_eq!(spot_vm["orgId"], OUTSIDER);
    assert_eq!(spot_vm["status"], "running");
}
