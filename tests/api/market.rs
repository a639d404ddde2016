//! The spot market over HTTP: what a buyer outside every reservation finds in
//! `GET /v1/market`, how placement and reclaim take units off it at once, which reservation
//! statuses sell nothing, and that the listing tells a buyer nothing more than "this unit is
//! for sale until T".

use serde_json::json;

use api_support::{App, Client, ReleaseSpec, ReservationSpec, Scenario, assert_invalid_parameters};

/// `nodeId/unitId` of every listed unit, following `nextCursor` with pages of `limit`.
fn listed(client: &Client, query: &str, limit: usize) -> Vec<String> {
    client
        .all_items(&format!("/v1/market?limit={limit}{query}"))
        .iter()
        .map(|item| {
            format!(
                "{}/{}",
                item["nodeId"].as_str().unwrap(),
                item["unitId"].as_str().unwrap()
            )
        })
        .collect()
}

fn released_idle(app: &App, node: &str) -> i64 {
    app.operator()
        .get(&format!("/v1/nodes/{node}"))
        .expect_status(200)
        .json()["releasedIdleUnitCount"]
        .as_i64()
        .expect("releasedIdleUnitCount")
}

struct Scene {
    app: App,
    owner: Client,
    buyer: Client,
    audience: Client,
    reservation: String,
    ends_at: String,
}

/// Node `n1` (u0..u7) of `owner`; a reservation of u0..u5 for `aud`, ending in a day, with
/// u1..u4 released; a community VM of the audience on u0; a second node `n2` with one
/// released unit of an open-ended reservation. `buyer` has no part in any of it.
fn scene() -> Scene {
    let scene = Scenario::new()
        .orgs(&["owner", "aud", "buyer"])
        .node(
            "n1",
            "owner",
            &["u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"],
        )
        .node("n2", "owner", &["w0", "w1"])
        .key("owner", "owner", "capacity-manager")
        .key("buyer", "buyer", "member")
        .key("audience", "aud", "member")
        .reservation(
            "r",
            ReservationSpec::on("n1", &["u0", "u1", "u2", "u3", "u4", "u5"])
                .audience(&["aud"])
                .ends_in(86_400)
                .contract_ref("secret-contract-7")
                .reason("secret-reason-9")
                .made_by("owner"),
        )
        .vm("audience", "n1", &["u0"], "community")
        .release(
            ReleaseSpec::of("r", &["u1", "u2", "u3", "u4"])
                .by("owner")
                .reason("idle"),
        )
        .reservation(
            "other",
            ReservationSpec::on("n2", &["w0"]).audience(&["aud"]),
        )
        .release(ReleaseSpec::of("other", &["w0"]))
        .open();
    Scene {
        owner: scene.client("owner"),
        buyer: scene.client("buyer"),
        audience: scene.client("audience"),
        reservation: scene.reservation_id("r"),
        ends_at: scene.reservation("r").request["endsAt"]
            .as_str()
            .expect("endsAt")
            .to_owned(),
        app: scene.app,
    }
}

#[test]
fn an_outsider_finds_exactly_the_idle_released_units_and_a_spot_vm_takes_one_off() {
    let s = scene();
    let all = ["n1/u1", "n1/u2", "n1/u3", "n1/u4", "n2/w0"];
    for limit in [1, 2, 100] {
        assert_eq!(listed(&s.buyer, "", limit), all, "pages of {limit}");
    }
    assert_eq!(
        listed(&s.buyer, "&nodeId=n1", 3),
        ["n1/u1", "n1/u2", "n1/u3", "n1/u4"]
    );
    assert_eq!(listed(&s.buyer, "&nodeId=n9", 3), Vec::<String>::new());
    assert_eq!(released_idle(&s.app, "n1"), 4);
    assert_eq!(released_idle(&s.app, "n2"), 1);

    // The outsider buys u2 at tier=spot; u2 leaves the market at once.
    let vm = s
        .buyer
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u2"], "tier": "spot" }),
        )
        .expect_status(201)
        .json();
    assert_eq!(
        listed(&s.buyer, "&nodeId=n1", 10),
        ["n1/u1", "n1/u3", "n1/u4"]
    );
    assert_eq!(released_idle(&s.app, "n1"), 3);
    // Only spot: a community request of the outsider is refused on a listed unit.
    s.buyer
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u3"], "tier": "community" }),
        )
        .expect_problem(409, "placement-refused");
    // When the VM stops, the unit is for sale again.
    s.buyer
        .delete(&format!("/v1/vms/{}", vm["id"].as_str().unwrap()))
        .expect_status(200);
    assert_eq!(
        listed(&s.buyer, "&nodeId=n1", 10),
        ["n1/u1", "n1/u2", "n1/u3", "n1/u4"]
    );
}

#[test]
fn a_reclaim_takes_units_off_the_market_at_once() {
    let s = scene();
    s.buyer
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_status(201);
    s.owner
        .post(
            &format!("/v1/nodes/n1/reservations/{}/reclaim", s.reservation),
            &json!({ "unitIds": ["u1", "u3"] }),
        )
        .expect_status(200);
    assert_eq!(listed(&s.buyer, "&nodeId=n1", 10), ["n1/u2", "n1/u4"]);
    assert_eq!(released_idle(&s.app, "n1"), 2);
    // u1's spot VM is gone with the reclaim, but u1 is no longer released: not for sale.
    s.buyer
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(409, "placement-refused");
}

#[test]
fn a_buyer_who_may_not_see_the_reservation_learns_only_unit_and_term_end() {
    let s = scene();
    // The buyer may not see the reservation itself...
    s.buyer
        .get(&format!("/v1/nodes/n1/reservations/{}", s.reservation))
        .expect_problem(404, "not-found");
    // ...and the listing says no more than "this unit of n1 is for sale, spot, until T".
    let reply = s.buyer.get("/v1/market?nodeId=n1");
    let text = reply.text();
    let page = reply.expect_status(200).json();
    for secret in [
        s.reservation.as_str(),
        "secret-contract-7",
        "secret-reason-9",
        "\"aud\"",
        "owner",
    ] {
        assert!(!text.contains(secret), "the listing leaks {secret}: {text}");
    }
    let ends_at = chrono::DateTime::parse_from_rfc3339(&s.ends_at).unwrap();
    for item in page["items"].as_array().unwrap() {
        let keys: Vec<&String> = item.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["endsAt", "nodeId", "tier", "unitId"], "{item}");
        assert_eq!(item["tier"], "spot");
        let listed_end =
            chrono::DateTime::parse_from_rfc3339(item["endsAt"].as_str().unwrap()).unwrap();
        assert_eq!(listed_end, ends_at);
    }
    // An open-ended reservation's units are listed without endsAt.
    let n2 = s
        .buyer
        .get("/v1/market?nodeId=n2")
        .expect_status(200)
        .json();
    assert_eq!(
        n2["items"],
        json!([{ "nodeId": "n2", "unitId": "w0", "tier": "spot" }])
    );
    // The audience sees the same listing as everyone else.
    assert_eq!(
        s.audience
            .get("/v1/market?nodeId=n1")
            .expect_status(200)
            .json(),
        page
    );
}

#[test]
fn only_active_reservations_sell_their_released_units() {
    let s = scene();
    // Past the term's end the reservation is expired: its units are off the market.
    s.app.set_clock_offset_secs(2 * 86_400);
    assert_eq!(listed(&s.buyer, "", 10), ["n2/w0"]);
    assert_eq!(released_idle(&s.app, "n1"), 0);
    s.app.set_clock_offset_secs(0);
    assert_eq!(listed(&s.buyer, "&nodeId=n1", 10).len(), 4);

    // A topology change withholds the reservation for review: nothing of it is for sale.
    s.app
        .operator()
        .put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"] }),
        )
        .expect_status(200);
    assert_eq!(listed(&s.buyer, "&nodeId=n1", 10), Vec::<String>::new());
    s.app
        .operator()
        .post(
            &format!("/v1/nodes/n1/reservations/{}/reaffirm", s.reservation),
            &json!({}),
        )
        .expect_status(200);
    assert_eq!(listed(&s.buyer, "&nodeId=n1", 10).len(), 4);

    // Cancelled: off the market for good.
    s.owner
        .post(
            &format!("/v1/nodes/n1/reservations/{}/cancel", s.reservation),
            &json!({}),
        )
        .expect_status(200);
    assert_eq!(listed(&s.buyer, "", 10), ["n2/w0"]);
}

#[test]
fn bad_market_queries_are_problems() {
    let s = scene();
    assert_invalid_parameters(
        &s.buyer,
        "/v1/market?",
        &[
            ("cursor=n1", "cursor"),
            ("cursor=n1%2Fu1%2Fx", "cursor"),
            ("limit=0", "limit"),
            ("limit=1001", "limit"),
            ("nodeId=bad%20id", "nodeId"),
        ],
    );
    s.buyer
        .get("/v1/market?colour=red")
        .expect_problem(400, "unknown-parameter");
    let narrow = s.app.key("buyer", "member", Some(&["vm.read"]));
    narrow.get("/v1/market").expect_problem(403, "forbidden");
    s.app
        .anonymous()
        .get("/v1/market")
        .expect_problem(401, "unauthorized");
}
