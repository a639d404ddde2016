//! What each request costs the database, end to end, in statements the app's components run
//! (the store's own suite counts the same below the HTTP layer, on local files and a faked
//! replica): the key's look-up, the request's reads, and at most one write. Run on every
//! store the test command gives it, a real sqld primary among them, the counts are the same;
//! at an edge site a write runs at home, and the site looks that its copy has it (once, or
//! again while the copy catches up). With the market in cells a keyed request also claims its key in the
//! directory.

use serde_json::json;

use api_support::positions::cells_under_test;
use api_support::{App, Client, ReleaseSpec, ReservationSpec, Scenario};

const NODE: &str = "n1";

/// Statements while `request` runs.
fn statements(app: &App, request: impl FnOnce()) -> u64 {
    let before = app.sqlite_statements().statements;
    request();
    app.sqlite_statements().statements - before
}

#[test]
fn each_request_costs_its_look_up_its_reads_and_one_write_on_every_store() {
    let scene = Scenario::new()
        .orgs(&["owner", "aud", "buyer"])
        .node(NODE, "owner", &["g0", "g1", "g2", "g3"])
        .key("owner", "owner", "capacity-manager")
        .key("buyer", "buyer", "member")
        .reservation(
            "r",
            ReservationSpec::on(NODE, &["g0", "g1", "g2", "g3"]).audience(&["aud"]),
        )
        .release(ReleaseSpec::of("r", &["g0"]))
        .vm("buyer", NODE, &["g0"], "spot")
        .open();
    let app = &scene.app;
    // At an edge deployment, at one site and without a session's bookmark (which would add
    // a look at the copy's position to each request).
    let owner = Client::new(&app.base, scene.client("owner").token().map(str::to_owned));
    let reservation = scene.reservation_path("r");
    // Once, each cell's store asks whether its database forwards writes (then remembers).
    owner.get(&reservation).expect_status(200);
    let at_a_site = app.sites().is_some();
    let write = if at_a_site { 2 } else { 1 };
    let claim = u64::from(cells_under_test() > 1);

    let keyed_release = || {
        owner
            .with_header("idempotency-key", "costs-once")
            .post(
                &format!("{reservation}/release"),
                &json!({ "unitIds": ["g2"] }),
            )
            .expect_status(200);
    };
    let counted = [
        (
            "GET reservation",
            statements(app, || {
                owner.get(&reservation).expect_status(200);
            }),
            1 + 1,
        ),
        (
            "release",
            statements(app, || {
                owner
                    .post(
                        &format!("{reservation}/release"),
                        &json!({ "unitIds": ["g1"] }),
                    )
                    .expect_status(200);
            }),
            1 + 1 + write,
        ),
        (
            "dry run",
            statements(app, || {
                owner
                    .post(
                        &format!("{reservation}/reclaim/dry-run"),
                        &json!({ "unitIds": ["g0"] }),
                    )
                    .expect_status(200);
            }),
            1 + 1,
        ),
        (
            "reclaim terminating a spot VM",
            statements(app, || {
                owner
                    .post(
                        &format!("{reservation}/reclaim"),
                        &json!({ "unitIds": ["g0"] }),
                    )
                    .expect_status(200);
            }),
            1 + 1 + write,
        ),
        (
            "keyed release",
            statements(app, keyed_release),
            1 + claim + 1 + 1 + write,
        ),
        (
            "the same keyed release replayed",
            statements(app, keyed_release),
            // The record's look-up, and the position its bookmark answers (nothing wrote it).
            1 + claim + 1 + 1,
        ),
    ];
    // At a site a write runs at home and is answered once the site's copy has it, looked at
    // until it does: at least once, more often when the copy is slow to catch up (a replay
    // too: its bookmark is looked for at the copy).
    let writes = [
        "release",
        "reclaim terminating a spot VM",
        "keyed release",
        "the same keyed release replayed",
    ];
    let unexpected: Vec<_> = counted
        .iter()
        .filter(
            |(name, counted, expected)| match at_a_site && writes.contains(name) {
                true => counted < expected,
                false => counted != expected,
            },
        )
        .collect();
    assert!(
        unexpected.is_empty(),
        "(request, statements, expected): {unexpected:?}"
    );
}
