//! Who sees a VM: its org, and the capacity owners of the units it runs on.

use super::*;

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
