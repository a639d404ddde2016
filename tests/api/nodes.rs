//! Nodes over HTTP: registering (operators), updating units (operators and the owner org
//! with node.write), the topology generation, units that run VMs, reading and listing.

use serde_json::{Value, json};

use api_support::{App, strings};

fn put_node(
    client: &api_support::Client,
    id: &str,
    owner: &str,
    units: &[&str],
) -> api_support::Reply {
    client.put(
        &format!("/v1/nodes/{id}"),
        &json!({ "ownerOrgId": owner, "unitIds": units }),
    )
}

fn topology_gen(node: &Value) -> i64 {
    node["topologyGen"].as_i64().expect("topologyGen")
}

#[test]
fn put_registers_a_node_then_updates_it() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();

    let created = put_node(&operator, "n1", "acme", &["g0", "g1"]).expect_status(201);
    assert_eq!(created.header("location"), Some("/v1/nodes/n1"));
    let created = created.json();
    assert_eq!(created["id"], "n1");
    assert_eq!(created["ownerOrgId"], "acme");
    assert_eq!(created["unitIds"], json!(["g0", "g1"]));
    assert_eq!(created["unitCount"], 2);
    assert_eq!(topology_gen(&created), 1);
    assert_eq!(created["withheldReservationIds"], json!([]));
    assert!(created["createdAt"].is_string() && created["updatedAt"].is_string());

    let updated = put_node(&operator, "n1", "acme", &["g0", "g1", "g2"])
        .expect_status(200)
        .json();
    assert_eq!(strings(&updated["unitIds"]), ["g0", "g1", "g2"]);
    assert_eq!(updated["unitCount"], 3);
    assert_eq!(topology_gen(&updated), 2);
    assert_eq!(updated["createdAt"], created["createdAt"]);

    let read = operator.get("/v1/nodes/n1").expect_status(200).json();
    assert_eq!(strings(&read["unitIds"]), ["g0", "g1", "g2"]);
    assert_eq!(topology_gen(&read), 2);
    assert!(
        read.get("withheldReservationIds").is_none(),
        "only a PUT reports what it withheld: {read}"
    );
}

#[test]
fn topology_generation_moves_only_when_the_unit_set_changes() {
    let app = App::start();
    app.org("acme");
    app.org("other");
    let operator = app.operator();
    app.node("n1", "acme", &["a", "b", "c"]);

    let same = put_node(&operator, "n1", "acme", &["a", "b", "c"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&same), 1, "the same set");
    let reordered = put_node(&operator, "n1", "acme", &["c", "a", "b"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&reordered), 1, "order is not a change");
    let new_owner = put_node(&operator, "n1", "other", &["a", "b", "c"])
        .expect_status(200)
        .json();
    assert_eq!(new_owner["ownerOrgId"], "other");
    assert_eq!(
        topology_gen(&new_owner),
        1,
        "an owner change is not a topology change"
    );

    let removed = put_node(&operator, "n1", "other", &["b", "c"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&removed), 2);
    assert_eq!(strings(&removed["unitIds"]), ["b", "c"]);
    let swapped = put_node(&operator, "n1", "other", &["b", "d"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&swapped), 3, "same size, different set");
    assert_eq!(strings(&swapped["unitIds"]), ["b", "d"]);

    let stored: (i64, i64) = app
        .db()
        .query_row(
            "SELECT topology_gen, (SELECT COUNT(*) FROM node_units WHERE node_id = 'n1') FROM nodes WHERE id = 'n1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("node row");
    assert_eq!(stored, (3, 2));
}

#[test]
fn units_keep_a_stable_order_across_removals_and_additions() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    app.node("n1", "acme", &["a", "b", "z"]);
    put_node(&operator, "n1", "acme", &["b", "z"]).expect_status(200);
    let grown = put_node(&operator, "n1", "acme", &["b", "z", "c"])
        .expect_status(200)
        .json();
    assert_eq!(
        grown["unitIds"],
        json!(["b", "z", "c"]),
        "an added unit comes last"
    );
    let read = operator.get("/v1/nodes/n1").expect_status(200).json();
    assert_eq!(read["unitIds"], json!(["b", "z", "c"]));
}

#[test]
fn the_owner_org_updates_units_with_node_write_but_not_the_owner() {
    let app = App::start();
    app.org("acme");
    app.org("other");
    app.node("n1", "acme", &["g0"]);
    let manager = app.key("acme", "capacity-manager", None);
    let admin = app.key("acme", "admin", None);
    let member = app.key("acme", "member", None);
    let narrowed = app.key("acme", "admin", Some(&["node.read", "reservation.write"]));
    let stranger = app.key("other", "admin", None);

    let updated = put_node(&manager, "n1", "acme", &["g0", "g1"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&updated), 2);
    put_node(&admin, "n1", "acme", &["g0", "g1", "g2"]).expect_status(200);

    for (who, key) in [("member", &member), ("narrowed admin", &narrowed)] {
        let problem = put_node(key, "n1", "acme", &["g0"]).expect_problem(403, "forbidden");
        assert!(
            problem["detail"].as_str().unwrap().contains("node.write"),
            "{who}: {problem}"
        );
    }
    put_node(&manager, "n1", "other", &["g0", "g1", "g2"]).expect_problem(403, "forbidden");
    put_node(&stranger, "n1", "other", &["g0"]).expect_problem(403, "forbidden");
    put_node(&stranger, "n1", "acme", &["g0"]).expect_problem(403, "forbidden");
    // Registering a node is for operators, even for the org that would own it.
    put_node(&admin, "n2", "acme", &["g0"]).expect_problem(403, "forbidden");
    put_node(&app.anonymous(), "n2", "acme", &["g0"]).expect_problem(401, "unauthorized");

    let node = app.operator().get("/v1/nodes/n1").expect_status(200).json();
    assert_eq!(node["ownerOrgId"], "acme");
    assert_eq!(strings(&node["unitIds"]), ["g0", "g1", "g2"]);
    assert_eq!(topology_gen(&node), 3, "refused updates changed nothing");
    app.operator()
        .get("/v1/nodes/n2")
        .expect_problem(404, "not-found");
}

#[test]
fn node_input_is_validated() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();

    let problem = put_node(&operator, "n1", "ghost", &["g0"]).expect_problem(422, "unknown-orgs");
    assert_eq!(problem["orgIds"], json!(["ghost"]));
    let problem = put_node(&operator, "n1", "acme", &["g0", "g1", "g0", "g1", "g2"])
        .expect_problem(422, "duplicate-ids");
    assert_eq!(problem["field"], "unitIds");
    assert_eq!(problem["ids"], json!(["g0", "g1"]));
    let problem = put_node(&operator, "n1", "acme", &[]).expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "unitIds");
    let problem =
        put_node(&operator, "n1", "acme", &["ok", "not/ok"]).expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "unitIds");
    let problem = operator
        .put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "acme", "unitIds": ["g0"], "gpuModel": "h100" }),
        )
        .expect_problem(400, "unknown-field");
    assert!(
        problem["detail"].as_str().unwrap().contains("gpuModel"),
        "{problem}"
    );
    operator
        .put("/v1/nodes/n1", &json!({ "unitIds": ["g0"] }))
        .expect_problem(400, "missing-field");
    put_node(&operator, "bad%20id", "acme", &["g0"]).expect_problem(404, "not-found");

    operator
        .get("/v1/nodes/n1")
        .expect_problem(404, "not-found");
    let nodes: i64 = app
        .db()
        .query_row("SELECT COUNT(*) FROM nodes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(nodes, 0, "no refused PUT registered anything");

    // An update is validated the same way, and a refused one changes nothing.
    app.node("n1", "acme", &["g0"]);
    let problem =
        put_node(&operator, "n1", "acme", &["g0", "g0"]).expect_problem(422, "duplicate-ids");
    assert_eq!(problem["ids"], json!(["g0"]));
    put_node(&operator, "n1", "ghost", &["g0"]).expect_problem(422, "unknown-orgs");
    let node = operator.get("/v1/nodes/n1").expect_status(200).json();
    assert_eq!(
        (node["ownerOrgId"].clone(), topology_gen(&node)),
        (json!("acme"), 1)
    );
}

#[test]
fn a_unit_that_runs_a_vm_cannot_be_removed() {
    let app = App::start();
    app.org("acme");
    app.org("tenant");
    app.node("n1", "acme", &["g0", "g1", "g2"]);
    let tenant = app.key("tenant", "member", None);
    let vm = tenant
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["g1", "g2"], "tier": "community" }),
        )
        .expect_status(201)
        .json();
    assert_eq!(vm["status"], "running");

    let problem =
        put_node(&app.operator(), "n1", "acme", &["g0"]).expect_problem(409, "units-in-use");
    assert_eq!(problem["unitIds"], json!(["g1", "g2"]));
    let problem = put_node(&app.operator(), "n1", "acme", &["g0", "g1", "g9"])
        .expect_problem(409, "units-in-use");
    assert_eq!(problem["unitIds"], json!(["g2"]));
    let node = app.operator().get("/v1/nodes/n1").expect_status(200).json();
    assert_eq!(strings(&node["unitIds"]), ["g0", "g1", "g2"]);
    assert_eq!(
        topology_gen(&node),
        1,
        "a refused change does not move the generation"
    );

    // Units without VMs can still go, and once the VM is gone so can its units.
    let shrunk = put_node(&app.operator(), "n1", "acme", &["g1", "g2"])
        .expect_status(200)
        .json();
    assert_eq!(topology_gen(&shrunk), 2);
    tenant
        .delete(&format!("/v1/vms/{}", vm["id"].as_str().expect("id")))
        .expect_status(200);
    let emptied = put_node(&app.operator(), "n1", "acme", &["g3"])
        .expect_status(200)
        .json();
    assert_eq!(emptied["unitIds"], json!(["g3"]));
    assert_eq!(topology_gen(&emptied), 3);
}

#[test]
fn nodes_are_read_and_listed_with_a_cursor() {
    let app = App::start();
    app.org("acme");
    app.org("other");
    let ids = ["n1", "n2", "n3", "n4", "n5", "n6", "n7"];
    for (i, id) in ids.iter().enumerate() {
        let owner = if i % 2 == 0 { "acme" } else { "other" };
        app.node(id, owner, &["g0", "g1"]);
    }
    let viewer = app.key("other", "viewer", None);

    let node = viewer.get("/v1/nodes/n3").expect_status(200).json();
    assert_eq!(node["ownerOrgId"], "acme");
    assert_eq!(node["unitIds"], json!(["g0", "g1"]));
    viewer.get("/v1/nodes/n99").expect_problem(404, "not-found");

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/nodes?limit=3".to_owned(),
            Some(c) => format!("/v1/nodes?limit=3&cursor={c}"),
        };
        let page = viewer.get(&path).expect_status(200).json();
        pages += 1;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        for item in items {
            assert_eq!(item["unitCount"], 2);
            assert!(
                item.get("unitIds").is_none(),
                "listings leave the units out: {item}"
            );
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    assert_eq!(pages, 3);

    let acme = viewer
        .get("/v1/nodes?ownerOrgId=acme")
        .expect_status(200)
        .json();
    let acme_ids: Vec<&str> = acme["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(acme_ids, ["n1", "n3", "n5", "n7"]);
    assert!(acme.get("nextCursor").is_none());
    let first = viewer
        .get("/v1/nodes?ownerOrgId=acme&limit=2")
        .expect_status(200)
        .json();
    assert_eq!(first["items"][1]["id"], "n3");
    let cursor = first["nextCursor"].as_str().expect("a second page");
    let second = viewer
        .get(&format!(
            "/v1/nodes?ownerOrgId=acme&limit=2&cursor={cursor}"
        ))
        .expect_status(200)
        .json();
    assert_eq!(second["items"][0]["id"], "n5");
    assert_eq!(second["items"][1]["id"], "n7");
    assert!(
        second.get("nextCursor").is_none(),
        "the last page: {second}"
    );

    viewer
        .get("/v1/nodes?limit=0")
        .expect_problem(400, "invalid-parameter");
    viewer
        .get("/v1/nodes?sort=id")
        .expect_problem(400, "unknown-parameter");
    app.anonymous()
        .get("/v1/nodes")
        .expect_problem(401, "unauthorized");
    let without_node_read = app.key("other", "admin", Some(&["vm.read"]));
    without_node_read
        .get("/v1/nodes")
        .expect_problem(403, "forbidden");
    without_node_read
        .get("/v1/nodes/n1")
        .expect_problem(403, "forbidden");
}

/// A node update is answered from its plan: the update's one read and its one write (the
/// operator's token needs no look-up), and after the write, at an edge site only, the look
/// that the site's copy has it (the newest position, nothing of the node), so the answer
/// (units for sale included) can never be lost to a failure after the change landed.
#[test]
fn a_node_update_reads_nothing_after_its_write() {
    let app = App::start();
    app.org("acme");
    app.org("research");
    let operator = app.operator();
    put_node(&operator, "n1", "acme", &["g0", "g1", "g2"]).expect_status(201);
    let reservation = app.reservation("n1", &["g0", "g1"], &["research"], &[]);
    let path = format!(
        "/v1/nodes/n1/reservations/{}/release",
        reservation["id"].as_str().expect("an id")
    );
    operator
        .post(&path, &json!({ "unitIds": ["g0", "g1"], "reason": "idle" }))
        .expect_status(200);
    let looks_at_the_copy = match app.sites() {
        Some(_) => 1,
        None => 0,
    };
    for (units, for_sale) in [(&["g0", "g1", "g2"][..], 2), (&["g0", "g1", "g2", "g3"], 0)] {
        let before = app.sqlite_statements();
        let answer = put_node(&operator, "n1", "acme", units)
            .expect_status(200)
            .json();
        let spent = app.sqlite_statements() - before;
        // At a site the copy is looked at until it has the write: once, or more while it
        // catches up.
        let expected = 2 + looks_at_the_copy;
        assert!(
            spent.in_write_transaction == 0
                && match looks_at_the_copy {
                    0 => spent.statements == expected,
                    _ => spent.statements >= expected,
                },
            "read, write and the looks at a site's copy for units {units:?}: {spent:?}"
        );
        assert_eq!(answer["releasedIdleUnitCount"], for_sale, "{answer}");
        let read = operator.get("/v1/nodes/n1").expect_status(200).json();
        assert_eq!(read["releasedIdleUnitCount"], for_sale, "{read}");
    }
}
