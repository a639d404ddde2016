//! The market in cells (docs/design.md, "Cells"): what a request costs each cell's database,
//! counted by label; a key revoked while its nodes sit in other cells; adding a cell with the
//! operator's procedure (`scripts/cells-move`), after which every node is served where its id
//! names and every chain still verifies.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::json;

use api_support::positions::beyond_every_event;
use api_support::{App, workspace};
use reservations_store::cells::{Cell, Cells};

const CELLS: usize = 4;

/// An id of a node that lives in `cell` of `cells`.
fn node_in(cells: usize, cell: usize) -> String {
    let cells = Cells::new(cells).unwrap();
    (0..)
        .map(|n| format!("node-{n}"))
        .find(|id| cells.home_of(id).index() == cell)
        .unwrap()
}

fn labels(cells: usize) -> Vec<String> {
    Cells::new(cells).unwrap().all().map(Cell::label).collect()
}

/// Statements on each label while `request` runs.
fn statements_by_label(app: &App, request: impl FnOnce()) -> BTreeMap<String, u64> {
    let before: Vec<u64> = labels(CELLS).iter().map(|l| app.statements_on(l)).collect();
    request();
    labels(CELLS)
        .into_iter()
        .zip(before)
        .map(|(label, before)| {
            let now = app.statements_on(&label);
            (label, now - before)
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(l, c)| ((*l).to_owned(), *c)).collect()
}

#[test]
fn a_request_about_a_node_costs_its_cell_and_the_key_s_look_up_only() {
    let app = App::start_on_cells(CELLS);
    app.org("owner");
    app.org("aud");
    let owner = app.key("owner", "capacity-manager", None);
    let nodes: Vec<String> = (0..CELLS).map(|cell| node_in(CELLS, cell)).collect();
    let mut reservations = Vec::new();
    for node in &nodes {
        app.node(node, "owner", &["g0", "g1"]);
        let reservation = app.reservation(node, &["g0", "g1"], &["aud"], &[]);
        reservations.push(reservation["id"].as_str().unwrap().to_owned());
    }
    // Once per cell the store asks whether its database forwards writes (then remembers).
    for (node, reservation) in nodes.iter().zip(&reservations) {
        owner
            .get(&format!("/v1/nodes/{node}/reservations/{reservation}"))
            .expect_status(200);
    }
    let node = &nodes[2];
    let reservation = format!("/v1/nodes/{node}/reservations/{}", reservations[2]);
    let release = statements_by_label(&app, || {
        owner
            .post(
                &format!("{reservation}/release"),
                &json!({ "unitIds": ["g0"] }),
            )
            .expect_status(200);
    });
    assert_eq!(
        release,
        counts(&[("default", 1), ("cell2", 2)]),
        "a release: the key at the directory, the read and the write at its cell"
    );
    let read = statements_by_label(&app, || {
        owner.get(&reservation).expect_status(200);
    });
    assert_eq!(read, counts(&[("default", 1), ("cell2", 1)]));
    // A listing across cells: one statement per cell (the directory's beside the key).
    let market = statements_by_label(&app, || {
        owner.get("/v1/market?limit=100").expect_status(200);
    });
    assert_eq!(
        market,
        counts(&[("default", 2), ("cell1", 1), ("cell2", 1), ("cell3", 1)])
    );
    // Of one node: its cell only.
    let one_node = statements_by_label(&app, || {
        owner
            .get(&format!("/v1/market?nodeId={node}"))
            .expect_status(200);
    });
    assert_eq!(one_node, counts(&[("default", 1), ("cell2", 1)]));
}

#[test]
fn a_poll_its_bounds_refuse_reads_no_cell() {
    let app = App::start_on_cells(CELLS);
    app.org("owner");
    let viewer = app.key("owner", "viewer", None);
    // The key holds its four places (as four polls that wait would).
    let key_id = api_support::key_id(&viewer);
    let directory = rusqlite::Connection::open(app.database_paths()[0]).unwrap();
    for n in 0..4 {
        directory
            .execute(
                "INSERT INTO feed_waits (id, key_id, org_id, started_at, until) \
                 VALUES (?1, ?2, 'owner', 0, 9000000000000)",
                [format!("wait-held-{n}"), key_id.clone()],
            )
            .unwrap();
    }
    let refused = statements_by_label(&app, || {
        viewer
            .get(&format!("/v1/events?after={}&wait=5", beyond_every_event()))
            .expect_problem(429, "too-many-waits");
    });
    assert_eq!(
        refused,
        counts(&[("default", 2)]),
        "the key's look-up and the places' read, both in the directory"
    );
    // Without a wait, the feed reads every cell's head.
    let read = statements_by_label(&app, || {
        viewer.get("/v1/events?wait=0").expect_status(200);
    });
    assert_eq!(read.len(), CELLS, "{read:?}");
}

/// An app of [`CELLS`] cells, an org `owner` with a node in each, and an admin key of it.
fn an_owner_with_a_node_in_every_cell() -> (App, Vec<String>, api_support::Client) {
    let app = App::start_on_cells(CELLS);
    app.org("owner");
    let nodes: Vec<String> = (0..CELLS).map(|cell| node_in(CELLS, cell)).collect();
    for node in &nodes {
        app.node(node, "owner", &["g0"]);
    }
    let owner = app.key("owner", "admin", None);
    (app, nodes, owner)
}

#[test]
fn a_revoked_key_is_refused_by_every_cell_before_its_revocation_is_answered() {
    let (app, nodes, owner) = an_owner_with_a_node_in_every_cell();
    let key_id = api_support::key_id(&owner);
    app.operator()
        .delete(&format!("/v1/orgs/owner/keys/{key_id}"))
        .expect_status(200);
    // Every cell holds the revocation, whatever a site's copy of the directory says.
    for (cell, path) in app.database_paths().into_iter().enumerate().skip(1) {
        let db = rusqlite::Connection::open(path).unwrap();
        let held: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM revoked_keys WHERE id = ?1",
                [&key_id],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(held, 1, "cell {cell}");
    }
    for node in &nodes {
        owner
            .put(
                &format!("/v1/nodes/{node}"),
                &json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g1"] }),
            )
            .expect_problem(401, "unauthorized");
    }
}

#[test]
fn each_cell_s_write_checks_the_revocations_it_holds() {
    let (app, nodes, owner) = an_owner_with_a_node_in_every_cell();
    let key_id = api_support::key_id(&owner);
    // One cell holds a revocation the directory has not recorded (as while a revocation is
    // on its way to every cell): that cell's write refuses the key, the others take it.
    let paths = app.database_paths();
    rusqlite::Connection::open(paths[2])
        .unwrap()
        .execute(
            "INSERT INTO revoked_keys (id, revoked_at) VALUES (?1, 1)",
            [&key_id],
        )
        .unwrap();
    for (cell, node) in nodes.iter().enumerate() {
        let update = owner.put(
            &format!("/v1/nodes/{node}"),
            &json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g1"] }),
        );
        match cell {
            2 => {
                update.expect_problem(401, "unauthorized");
            }
            _ => {
                update.expect_status(200);
            }
        }
    }
    owner.get("/v1/whoami").expect_status(200);
}

#[test]
fn an_idempotency_key_is_one_request_s_whichever_cells_the_requests_are_at_home_in() {
    let app = App::start_on_cells(CELLS);
    app.org("owner");
    app.org("aud");
    let owner = app.key("owner", "capacity-manager", None);
    let audience = app.key("aud", "member", None);
    let (here, there) = (node_in(CELLS, 1), node_in(CELLS, 3));
    let mut releases = Vec::new();
    for node in [&here, &there] {
        app.node(node, "owner", &["g0", "g1"]);
        let reservation = app.reservation(node, &["g0", "g1"], &["aud"], &[]);
        releases.push(format!(
            "/v1/nodes/{node}/reservations/{}/release",
            reservation["id"].as_str().unwrap()
        ));
    }
    let keyed = owner.with_header("idempotency-key", "release-once");
    let first = keyed.post(&releases[0], &json!({ "unitIds": ["g0"] }));
    first.expect_status(200);
    // The same request again is replayed; the key used for a release of a node in another
    // cell is refused, and nothing is released there.
    let again = keyed.post(&releases[0], &json!({ "unitIds": ["g0"] }));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    keyed
        .post(&releases[1], &json!({ "unitIds": ["g0"] }))
        .expect_problem(422, "idempotency-key-reused");
    let there_now = owner
        .get(&format!("/v1/market?nodeId={there}"))
        .expect_status(200)
        .json();
    assert_eq!(
        there_now["items"],
        json!([]),
        "nothing released in the other cell"
    );

    // A VM's placement likewise: the key of a placement on one cell's node is refused for
    // a placement on another's, and only one VM is placed.
    let placing = audience.with_header("idempotency-key", "place-once");
    placing
        .post(
            "/v1/vms",
            &json!({ "nodeId": here, "unitIds": ["g1"], "tier": "community" }),
        )
        .expect_status(201);
    placing
        .post(
            "/v1/vms",
            &json!({ "nodeId": there, "unitIds": ["g1"], "tier": "community" }),
        )
        .expect_problem(422, "idempotency-key-reused");
    let vms = audience.get("/v1/vms").expect_status(200).json();
    assert_eq!(vms["items"].as_array().unwrap().len(), 1, "{vms}");
    // A key the directory claimed stays the first request's: its retry is still replayed.
    placing
        .post(
            "/v1/vms",
            &json!({ "nodeId": here, "unitIds": ["g1"], "tier": "community" }),
        )
        .expect_status(201);
    let vms = audience.get("/v1/vms").expect_status(200).json();
    assert_eq!(vms["items"].as_array().unwrap().len(), 1, "{vms}");
}

#[test]
fn adding_a_cell_moves_the_nodes_it_names_and_every_chain_still_verifies() {
    let app = App::start_on_cells(2);
    app.org("owner");
    app.org("aud");
    let nodes: Vec<String> = (0..24).map(|n| format!("n-{n}")).collect();
    for node in &nodes {
        app.node(node, "owner", &["g0", "g1"]);
        let reservation = app.reservation(node, &["g0"], &["aud"], &[]);
        app.operator()
            .post(
                &format!(
                    "/v1/nodes/{node}/reservations/{}/release",
                    reservation["id"].as_str().unwrap()
                ),
                &json!({ "unitIds": ["g0"] }),
            )
            .expect_status(200);
    }
    let verified = app
        .operator()
        .get("/v1/audit/verify")
        .expect_status(200)
        .json();
    assert_eq!(verified["ok"], true, "{verified}");
    // The new cell's schema first (health, as a deployment starts), then the move, offline.
    let app = app.restarted_on_cells(3, |_| {});
    let moved = std::cell::RefCell::new(String::new());
    let app = app.restarted_on_cells(3, |files: &[PathBuf]| {
        let output = Command::new("python3")
            .arg(workspace().join("scripts/cells-move"))
            .args(files)
            .output()
            .expect("run scripts/cells-move");
        assert!(output.status.success(), "{output:?}");
        *moved.borrow_mut() = String::from_utf8_lossy(&output.stdout).into_owned();
    });
    let three = Cells::new(3).unwrap();
    let expected: Vec<&String> = nodes
        .iter()
        .filter(|node| three.home_of(node).index() == 2)
        .collect();
    let moved = moved.into_inner();
    assert!(!expected.is_empty());
    for node in &expected {
        assert!(
            moved.contains(&format!("{node}: ")),
            "{node} moved: {moved}"
        );
    }
    assert!(
        moved.contains(&format!("{} nodes moved", expected.len())),
        "{moved}"
    );
    // Every node is served from the cell its id names now, with its whole history.
    let operator = app.operator();
    let listed = operator
        .get("/v1/nodes?limit=100")
        .expect_status(200)
        .json();
    assert_eq!(listed["items"].as_array().unwrap().len(), nodes.len());
    let market = operator
        .get("/v1/market?limit=100")
        .expect_status(200)
        .json();
    assert_eq!(market["items"].as_array().unwrap().len(), nodes.len());
    for node in &expected {
        let events = operator
            .get(&format!("/v1/audit?nodeId={node}"))
            .expect_status(200)
            .json();
        let actions: Vec<&str> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            ["node.create", "reservation.create", "reservation.release"]
        );
        operator
            .put(
                &format!("/v1/nodes/{node}"),
                &json!({ "ownerOrgId": "owner", "unitIds": ["g0", "g1", "g2"] }),
            )
            .expect_status(200);
    }
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(verified["ok"], true, "{verified}");
}

/// What a caller of a node in another cell, of a node in the failing cell and of a listing
/// across cells gets, while one cell's sqld is stalled (SIGSTOP: it keeps its sockets and
/// answers nothing), then killed, then back. No request may wait past the client's patience.
#[test]
fn a_cell_s_server_failing_stops_that_cell_only() {
    const THREE: usize = 3;
    let mut app = App::start_on_sqld_cells(THREE);
    app.org("owner");
    app.org("aud");
    let patience = std::time::Duration::from_secs(60);
    let owner = app
        .key("owner", "capacity-manager", None)
        .with_timeout(patience);
    let healthy = node_in(THREE, 1);
    let failing = node_in(THREE, 2);
    let mut releases = BTreeMap::new();
    for node in [&healthy, &failing] {
        app.node(node, "owner", &["g0", "g1", "g2"]);
        let reservation = app.reservation(node, &["g0", "g1", "g2"], &["aud"], &[]);
        let path = format!(
            "/v1/nodes/{node}/reservations/{}",
            reservation["id"].as_str().unwrap()
        );
        releases.insert(node.clone(), path);
    }
    let release = |node: &str, unit: &str, key: &str| {
        owner.with_header("idempotency-key", key).post(
            &format!("{}/release", releases[node]),
            &json!({ "unitIds": [unit] }),
        )
    };
    let anonymous = app.anonymous().without_contract().with_timeout(patience);
    let operator = app.operator().with_timeout(patience);
    // Health stays ready whatever a cell does, and says which cell requests lost.
    let health_says = |cell2: &str| {
        let health = anonymous.get("/v1/healthz").expect_status(200).json();
        assert_eq!(health["checks"]["cells"]["cell1"], "ok", "{health}");
        assert_eq!(health["checks"]["cells"]["cell2"], cell2, "{health}");
    };
    let served_elsewhere = |unit: &str| {
        release(&healthy, unit, &format!("healthy-{unit}")).expect_status(200);
        owner.get(&releases[&healthy]).expect_status(200);
    };
    let refused = |reply: api_client::Reply, code: &str| {
        assert!(reply.header("retry-after").is_some(), "{code}: Retry-After");
        reply.expect_problem(503, code);
    };

    app.cell_primary(2).stall();
    served_elsewhere("g0");
    // No request has met the stall yet: health, which does not ask a migrated cell, knows
    // nothing of it.
    health_says("ok");
    refused(
        release(&failing, "g0", "failing-g0"),
        "storage-unresponsive",
    );
    refused(owner.get(&releases[&failing]), "storage-unresponsive");
    refused(owner.get("/v1/market?limit=100"), "storage-unresponsive");
    health_says("unavailable");

    app.cell_primary(2).kill();
    served_elsewhere("g1");
    health_says("unavailable");
    refused(release(&failing, "g0", "failing-g0"), "storage-unavailable");
    refused(owner.get("/v1/market?limit=100"), "storage-unavailable");
    refused(operator.get("/v1/audit?limit=10"), "storage-unavailable");

    app.cell_primary(2).start_again();
    // Sent again with its key, the write refused twice takes effect once.
    let released = release(&failing, "g0", "failing-g0")
        .expect_status(200)
        .json();
    assert_eq!(
        release(&failing, "g0", "failing-g0")
            .expect_status(200)
            .json(),
        released
    );
    let events = operator
        .get(&format!("/v1/audit?nodeId={failing}"))
        .expect_status(200)
        .json();
    let releases_applied = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "reservation.release")
        .count();
    assert_eq!(releases_applied, 1, "{events}");
    let market = owner.get("/v1/market?limit=100").expect_status(200).json();
    let listed: std::collections::BTreeSet<&str> = market["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["nodeId"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [healthy.as_str(), failing.as_str()].into(),
        "{market}"
    );
    // Once no request has lost it for a while, health reports it answering again.
    api_support::until("health reports cell2 answering again", patience, || {
        anonymous.get("/v1/healthz").expect_status(200).json()["checks"]["cells"]["cell2"] == "ok"
    });
}
