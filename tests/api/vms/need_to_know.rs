//! What a VM tells the parties of reservations made before or after it.

use super::*;

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
