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

// ------------------------------------------------------------------------ reads

#[test]
fn a_vm_is_seen_by_its_org_and_by_the_capacity_owners_of_its_reserved_units() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g1"]);
    let audience_vm = placed_vm(&market.audience, NODE, &["g0"], "community");
    let spot_vm = placed_vm(&market.outsider, NODE, &["g1"], "spot");
    let unreserved_vm = placed_vm(&market.outsider, NODE, &["g5"], "community");

    let sees = |client: &Client, vm: &str| -> u16 { client.get(&format!("/v1/vms/{vm}")).status };
    let operator = app.operator();
    let audience_viewer = app.key(AUDIENCE, "viewer", None);
    let cases: [(&str, &Client, [u16; 3]); 7] = [
        ("the VM's org", &market.audience, [200, 404, 404]),
        (
            "the VM's org, read-only key",
            &audience_viewer,
            [200, 404, 404],
        ),
        (
            "another audience org",
            &market.other_audience,
            [404, 404, 404],
        ),
        ("the node's owner", &market.owner, [200, 200, 404]),
        ("the managing org", &market.manager, [200, 200, 404]),
        ("an outsider", &market.outsider, [404, 200, 200]),
        ("an operator", &operator, [200, 200, 200]),
    ];
    for (who, client, expected) in cases {
        let got = [
            sees(client, &audience_vm),
            sees(client, &spot_vm),
            sees(client, &unreserved_vm),
        ];
        assert_eq!(
            got, expected,
            "{who} reading [audience, spot, unreserved] VMs"
        );
    }
    let problem = market
        .other_audience
        .get(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(404, "not-found");
    let missing = market
        .other_audience
        .get("/v1/vms/vm-does-not-exist")
        .expect_problem(404, "not-found");
    assert_eq!(
        problem["detail"], missing["detail"],
        "a hidden VM looks missing"
    );
    app.key(AUDIENCE, "admin", Some(&["vm.write"]))
        .get(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    app.anonymous()
        .get(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(401, "unauthorized");

    let list = |client: &Client, query: &str| {
        ids(&client
            .get(&format!("/v1/vms{query}"))
            .expect_status(200)
            .json())
    };
    assert_eq!(list(&market.audience, ""), sorted([&audience_vm]));
    assert_eq!(list(&market.other_audience, ""), Vec::<String>::new());
    assert_eq!(
        list(&market.outsider, ""),
        sorted([&spot_vm, &unreserved_vm])
    );
    assert_eq!(list(&market.owner, ""), sorted([&audience_vm, &spot_vm]));
    assert_eq!(list(&market.manager, ""), sorted([&audience_vm, &spot_vm]));
    assert_eq!(
        list(&operator, ""),
        sorted([&audience_vm, &spot_vm, &unreserved_vm])
    );

    // Filters.
    app.node("n2", OUTSIDER, &["h0"]);
    let elsewhere = placed_vm(&market.outsider, "n2", &["h0"], "verified");
    market
        .outsider
        .delete(&format!("/v1/vms/{unreserved_vm}"))
        .expect_status(200);
    assert_eq!(
        list(&market.outsider, "?nodeId=n1"),
        sorted([&spot_vm, &unreserved_vm])
    );
    assert_eq!(list(&market.outsider, "?nodeId=n2"), sorted([&elsewhere]));
    assert_eq!(
        list(&market.outsider, "?status=running"),
        sorted([&spot_vm, &elsewhere])
    );
    assert_eq!(
        list(&market.outsider, "?status=terminated"),
        sorted([&unreserved_vm])
    );
    assert_eq!(
        list(&market.outsider, "?nodeId=n1&status=running"),
        sorted([&spot_vm])
    );
    assert_eq!(list(&market.owner, "?nodeId=n2"), Vec::<String>::new());
    market
        .outsider
        .get("/v1/vms?status=paused")
        .expect_problem(400, "invalid-parameter");
    market
        .outsider
        .get("/v1/vms?tier=spot")
        .expect_problem(400, "unknown-parameter");

    // Pages: one VM at a time, in id order, each once.
    let mut seen = Vec::new();
    let mut query = "?limit=1".to_owned();
    loop {
        let page = operator
            .get(&format!("/v1/vms{query}"))
            .expect_status(200)
            .json();
        seen.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(cursor) => query = format!("?limit=1&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        sorted([&audience_vm, &spot_vm, &unreserved_vm, &elsewhere])
    );

    // The capacity owners see VMs on units of an active reservation only.
    app.operator()
        .post(&format!("{}/cancel", market.reservation_path()), &json!({}))
        .expect_status(200);
    assert_eq!(list(&market.owner, ""), Vec::<String>::new());
    assert_eq!(sees(&market.manager, &spot_vm), 404);
    assert_eq!(sees(&market.audience, &audience_vm), 200);
}

// ------------------------------------------------------------------------ termination

#[track_caller]
fn terminated_by(client: &Client, vm: &str, reason: &str) {
    let vm = client
        .delete(&format!("/v1/vms/{vm}"))
        .expect_status(200)
        .json();
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminationReason"], reason);
    assert!(vm["terminatedAt"].is_string());
}

#[test]
fn who_may_terminate_a_vm() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g1", "g2", "g3"]);
    let audience_vm = placed_vm(&market.audience, NODE, &["g0"], "community");
    let spot_for_owner = placed_vm(&market.outsider, NODE, &["g1"], "spot");
    let spot_for_manager = placed_vm(&market.outsider, NODE, &["g2"], "spot");
    let spot_for_operator = placed_vm(&market.outsider, NODE, &["g3"], "spot");
    let unreserved_spot = placed_vm(&market.audience, NODE, &["g5"], "spot");

    // The capacity owners (node owner, managing org) stop spot VMs on the reserved units
    // with reservation.capacity...
    terminated_by(
        &market.owner,
        &spot_for_owner,
        "terminated-by-capacity-owner",
    );
    terminated_by(
        &market.manager,
        &spot_for_manager,
        "terminated-by-capacity-owner",
    );
    app.key(MANAGER, "admin", Some(&["reservation.capacity"]))
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_status(200);
    let spot_for_operator = placed_vm(&market.outsider, NODE, &["g3"], "spot");
    // ...but not without it, not a community VM, and not a VM on units they do not reserve.
    app.key(MANAGER, "viewer", None)
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_problem(403, "forbidden");
    market
        .manager
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    market
        .owner
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    market
        .owner
        .delete(&format!("/v1/vms/{unreserved_spot}"))
        .expect_problem(404, "not-found");
    // Strangers learn nothing; the VM's org needs vm.write.
    market
        .outsider
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(404, "not-found");
    market
        .other_audience
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(404, "not-found");
    app.key(AUDIENCE, "viewer", None)
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    app.anonymous()
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(401, "unauthorized");
    market
        .audience
        .delete("/v1/vms/vm-does-not-exist")
        .expect_problem(404, "not-found");

    terminated_by(&market.audience, &audience_vm, "stopped");
    terminated_by(&app.operator(), &spot_for_operator, "stopped-by-operator");
    terminated_by(&market.audience, &unreserved_spot, "stopped");

    // Terminating twice is a conflict, whoever asks.
    market
        .audience
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(409, "vm-terminated");
    market
        .owner
        .delete(&format!("/v1/vms/{spot_for_owner}"))
        .expect_problem(409, "vm-terminated");
    app.operator()
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_problem(409, "vm-terminated");

    // Every unit is free again, and the terminated VMs remain readable.
    assert!(market.running_units().is_empty());
    let vm = market
        .audience
        .get(&format!("/v1/vms/{audience_vm}"))
        .expect_status(200)
        .json();
    assert_eq!(vm["terminationReason"], "stopped");
    placed_vm(&market.audience, NODE, &["g0"], "verified");
    placed_vm(&market.outsider, NODE, &["g1", "g2", "g3"], "spot");
}

// ------------------------------------------------------------------------ invariants in the database

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Tries a write on the app's database in a transaction that is always rolled back; returns
/// SQLite's refusal, if any. The transaction first adds a running VM `forged` of the outsider
/// on `n1`, so that forged `vm_units` rows have a VM to belong to.
fn try_write(app: &App, statement: &str, params: &[&dyn rusqlite::ToSql]) -> Result<(), String> {
    let mut db = app.db();
    let tx = db.transaction().expect("begin");
    tx.execute(
        "INSERT INTO vms (id, org_id, node_id, tier, status, created_at) \
         VALUES ('forged', ?1, ?2, 'community', 'running', ?3)",
        rusqlite::params![OUTSIDER, NODE, now_millis()],
    )
    .expect("a VM row");
    let outcome = tx
        .execute(statement, params)
        .map(|_| ())
        .map_err(|e| e.to_string());
    tx.rollback().expect("rollback");
    outcome
}

const INSERT_VM_UNIT: &str = "INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at) \
     VALUES ('forged', 0, ?1, ?2, ?3, ?4, ?5)";

#[track_caller]
fn assert_refused(outcome: Result<(), String>, needle: &str) {
    match outcome {
        Ok(()) => panic!("the database accepted a write it must refuse ({needle})"),
        Err(message) => assert!(
            message.contains(needle),
            "{message:?} should mention {needle:?}"
        ),
    }
}

#[test]
fn the_database_itself_refuses_what_the_placement_rules_refuse() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g1"]);
    placed_vm(&market.outsider, NODE, &["g5"], "spot");
    placed_vm(&market.audience, NODE, &["g0"], "community");
    // A second node whose only reservation is withheld for review.
    app.node("n2", OWNER, &["h0", "h1"]);
    app.reservation("n2", &["h0"], &[AUDIENCE], &[]);
    app.operator()
        .put(
            "/v1/nodes/n2",
            &json!({ "ownerOrgId": OWNER, "unitIds": ["h0", "h1", "h2"] }),
        )
        .expect_status(200);

    // A unit runs at most one running VM...
    assert_refused(
        try_write(
            app,
            INSERT_VM_UNIT,
            &[&NODE, &"g5", &"spot", &1, &now_millis()],
        ),
        "UNIQUE constraint failed: vm_units.node_id, vm_units.unit_id",
    );
    assert_refused(
        try_write(
            app,
            INSERT_VM_UNIT,
            &[&NODE, &"g0", &"verified", &1, &now_millis()],
        ),
        "UNIQUE constraint failed",
    );
    // ...while terminated rows may pile up.
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&NODE, &"g5", &"spot", &0, &now_millis()],
    )
    .expect("a stopped VM's row is not a running VM");
    // Reviving a stopped VM's row on a busy unit is refused just the same.
    let stopped = placed_vm(&market.outsider, NODE, &["g6"], "spot");
    market
        .outsider
        .delete(&format!("/v1/vms/{stopped}"))
        .expect_status(200);
    placed_vm(&market.audience, NODE, &["g6"], "spot");
    assert_refused(
        try_write(
            app,
            "UPDATE vm_units SET running = 1 WHERE vm_id = ?1",
            &[&stopped],
        ),
        "refused: vm-rows-are-final",
    );
    // So is turning a VM into another tier behind the rules' back.
    assert_refused(
        try_write(
            app,
            "UPDATE vm_units SET tier = 'community' WHERE vm_id = ?1",
            &[&stopped],
        ),
        "refused: vm-rows-are-final",
    );

    // A community or verified VM is never on a released unit; a spot one may be.
    for tier in ["community", "verified"] {
        assert_refused(
            try_write(
                app,
                INSERT_VM_UNIT,
                &[&NODE, &"g1", &tier, &1, &now_millis()],
            ),
            "refused: released-spot-only",
        );
    }
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&NODE, &"g1", &"spot", &1, &now_millis()],
    )
    .expect("a spot VM may sit on a released unit");

    // Nothing is placed on a needs-review reservation's units, at any tier; its node's other
    // units are anyone's.
    for tier in ["spot", "community", "verified"] {
        assert_refused(
            try_write(
                app,
                INSERT_VM_UNIT,
                &[&"n2", &"h0", &tier, &1, &now_millis()],
            ),
            "refused: withheld-needs-review",
        );
    }
    try_write(
        app,
        INSERT_VM_UNIT,
        &[&"n2", &"h1", &"community", &1, &now_millis()],
    )
    .expect("a unit outside the withheld reservation is free");

    // A unit running a community VM is never released.
    assert_refused(
        try_write(
            app,
            "UPDATE reservation_units SET released = 1 WHERE reservation_id = ?1 AND unit_id = 'g0'",
            &[&market.reservation_id],
        ),
        "refused: units-not-idle",
    );
    // Nor written in already released.
    assert_refused(
        try_write(
            app,
            "INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released) \
             SELECT reservation_id, 999, node_id, unit_id, 1 FROM reservation_units \
             WHERE reservation_id = ?1 AND unit_id = 'g0'",
            &[&market.reservation_id],
        ),
        "refused: units-not-idle",
    );
    // A unit running a spot VM may be.
    placed_vm(&market.audience, NODE, &["g2"], "spot");
    try_write(
        app,
        "UPDATE reservation_units SET released = 1 WHERE reservation_id = ?1 AND unit_id = 'g2'",
        &[&market.reservation_id],
    )
    .expect("a unit running a spot VM is idle enough to release");

    // The API agrees with what the database kept.
    let reservation = market
        .owner
        .get(&market.reservation_path())
        .expect_status(200)
        .json();
    assert_eq!(reservation["releasedUnitIds"], json!(["g1"]));
}

/// Many requests for one unit at once: exactly one VM is placed, every other request is told
/// the unit is busy, whatever the interleaving.
#[test]
fn concurrent_placements_on_one_unit_place_exactly_one_vm() {
    let market = Market::open();
    let callers = [
        &market.outsider,
        &market.audience,
        &market.other_audience,
        &market.outsider,
        &market.audience,
        &market.other_audience,
    ];
    for unit in ["g4", "g5", "g6"] {
        let barrier = Barrier::new(callers.len());
        let replies: Vec<Reply> = std::thread::scope(|scope| {
            let handles: Vec<_> = callers
                .iter()
                .map(|client| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        place_vm(client, NODE, &[unit], "spot")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let (created, losers): (Vec<Reply>, Vec<Reply>) =
            replies.into_iter().partition(|r| r.status == 201);
        assert_eq!(created.len(), 1, "exactly one placement on {unit} wins");
        for reply in losers {
            assert_eq!(refusals(reply), refused(&[(unit, "unit-busy")]));
        }
    }
    assert_eq!(market.running_units().len(), 3);
    assert_eq!(market.vm_count(), 3);
}

/// A release racing a community placement on the same unit: one of them wins, never both.
#[test]
fn a_release_racing_a_community_placement_never_lets_both_win() {
    let market = Market::open();
    let release_path = format!("{}/release", market.reservation_path());
    let (owner, audience) = (market.owner.clone(), market.audience.clone());
    for unit in ["g1", "g2", "g3"] {
        let (release, placement) = at_once(
            || owner.post(&release_path, &json!({ "unitIds": [unit] })),
            || place_vm(&audience, NODE, &[unit], "community"),
        );
        match (release.status, placement.status) {
            (200, 409) => assert_eq!(
                refusals(placement),
                refused(&[(unit, "released-spot-only")])
            ),
            (409, 201) => {
                let problem = release.expect_problem(409, "units-not-idle");
                assert_eq!(problem["unitIds"], json!([unit]));
            }
            other => panic!(
                "release and community placement on {unit} ended {other:?}: {} / {}",
                release.text(),
                placement.text()
            ),
        }
    }
    // Whatever happened, no community VM sits on a released unit.
    let db = market.app.db();
    let violations: i64 = db
        .query_row(
            "SELECT count(*) FROM vm_units v JOIN reservation_units ru \
               ON ru.node_id = v.node_id AND ru.unit_id = v.unit_id \
             WHERE v.running = 1 AND v.tier <> 'spot' AND ru.released = 1",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(violations, 0);
}

// ------------------------------------------------------------------------ need to know

#[test]
fn a_reservation_made_later_does_not_show_its_managers_the_vms_that_ran_before_it() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g0"]);
    let earlier = placed_vm(&market.outsider, NODE, &["g0"], "spot");
    market
        .outsider
        .delete(&format!("/v1/vms/{earlier}"))
        .expect_status(200);
    app.operator()
        .post(&format!("{}/cancel", market.reservation_path()), &json!({}))
        .expect_status(200);
    // A new reservation of the same units, managed by an org new to them.
    app.org("mgr2");
    let later_manager = app.key("mgr2", "capacity-manager", None);
    let later = app.reservation(NODE, &["g0", "g1"], &[AUDIENCE], &["mgr2"]);
    let later_path = format!(
        "/v1/nodes/{NODE}/reservations/{}",
        later["id"].as_str().unwrap()
    );
    market
        .owner
        .post(
            &format!("{later_path}/release"),
            &json!({ "unitIds": ["g0"], "reason": "idle" }),
        )
        .expect_status(200);
    let current = placed_vm(&market.outsider, NODE, &["g0"], "spot");
    // The new manager sees the VM that runs on its capacity, not the one that ran before.
    assert_eq!(
        ids(&later_manager.get("/v1/vms").expect_status(200).json()),
        vec![current.clone()]
    );
    later_manager
        .get(&format!("/v1/vms/{earlier}"))
        .expect_problem(404, "not-found");
    later_manager
        .get(&format!("/v1/vms/{current}"))
        .expect_status(200);
}

#[test]
fn a_vm_under_notice_is_named_only_to_the_parties_of_the_reservation_that_gave_it() {
    let market = Market::open();
    let app = &market.app;
    app.org("stranger");
    let stranger = app.key("stranger", "member", None);
    market.release(&["g1"]);
    let spot = placed_vm(&market.outsider, NODE, &["g1"], "spot");
    market
        .owner
        .post(
            &format!("{}/reclaim", market.reservation_path()),
            &json!({ "unitIds": ["g1"], "reason": "training starts", "noticeSeconds": 600 }),
        )
        .expect_status(200);
    assert_eq!(
        refusals(place_vm(&stranger, NODE, &["g1"], "spot")),
        refused(&[("g1", "unavailable")])
    );
    // Cancelled, the reservation has no parties left to tell: the VM stays unnamed.
    app.operator()
        .post(&format!("{}/cancel", market.reservation_path()), &json!({}))
        .expect_status(200);
    assert_eq!(
        refusals(place_vm(&stranger, NODE, &["g1"], "spot")),
        refused(&[("g1", "unavailable")])
    );
    assert_eq!(
        refusals(place_vm(&market.audience, NODE, &["g1"], "community")),
        refused(&[("g1", "unavailable")])
    );
    // The buyer's VM runs on under its notice, without the reservation that gave it.
    let vm = market
        .outsider
        .get(&format!("/v1/vms/{spot}"))
        .expect_status(200)
        .json();
    assert_eq!(vm["interruption"]["reason"], "reclaimed", "{vm}");
    assert!(vm["interruption"].get("reservationId").is_none(), "{vm}");
}

#[test]
fn a_spot_buyer_is_not_told_which_reservation_took_its_vm_back() {
    let market = Market::open();
    market.release(&["g2"]);
    let spot = placed_vm(&market.outsider, NODE, &["g2"], "spot");
    market
        .owner
        .post(
            &format!("{}/reclaim", market.reservation_path()),
            &json!({ "unitIds": ["g2"], "reason": "training starts", "noticeSeconds": 600 }),
        )
        .expect_status(200);
    let as_buyer = |client: &Client| -> Value {
        client
            .get(&format!("/v1/vms/{spot}"))
            .expect_status(200)
            .json()["interruption"]
            .clone()
    };
    let buyer = as_buyer(&market.outsider);
    assert!(buyer.get("reservationId").is_none(), "{buyer}");
    let listed = market.outsider.get("/v1/vms").expect_status(200).json();
    assert!(
        listed["items"][0]["interruption"]
            .get("reservationId")
            .is_none(),
        "{listed}"
    );
    // The capacity's owner, who reads the VM as its manager, and operators are told.
    assert_eq!(
        as_buyer(&market.owner)["reservationId"],
        market.reservation_id.as_str()
    );
    assert_eq!(
        as_buyer(&market.app.operator())["reservationId"],
        market.reservation_id.as_str()
    );
}
