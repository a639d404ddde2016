//! Edge sites (docs/design.md, "Edge sites"): one sqld primary, a read replica per site whose
//! gRPC to the primary crosses a [`Link`] (delay, cut, calls counted), and the app at each
//! site on its replica. What is asserted: the calls a request makes to the primary (one per
//! write, none per read), read-your-writes at a site, bookmarks across sites, refusals that
//! lag explains decided again, a key revoked elsewhere refused at the primary, migrations
//! applied once while apps at every site start, and the faults of the topology (a link cut
//! and restored, a replica or the primary killed and restarted): writes fail cleanly and
//! apply once when retried, reads go on at the site, and everything converges.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use api_support::link::Link;
use api_support::stores::Sites;
use api_support::{App, Client, TempDir};

/// An edge deployment with the app at each site.
struct Edge {
    sites: Sites,
    apps: Vec<App>,
    _dir: TempDir,
}

impl Edge {
    /// `count` sites, the schema migrated by an app at the primary first.
    fn start(count: usize) -> Edge {
        let dir = TempDir::new("edge");
        let sites = Sites::start(dir.path(), count, Duration::ZERO);
        let at_primary = App::start_with_runtime_config(sites.primary_config());
        at_primary.anonymous().get("/v1/healthz").expect_status(200);
        drop(at_primary);
        let apps: Vec<App> = (1..=count)
            .map(|site| App::start_with_runtime_config(sites.site_config(site)))
            .collect();
        for app in &apps {
            app.anonymous().get("/v1/healthz").expect_status(200);
        }
        Edge {
            sites,
            apps,
            _dir: dir,
        }
    }

    fn site(&self, site: usize) -> &App {
        &self.apps[site - 1]
    }

    fn link(&self, site: usize) -> &Link {
        &self.sites.links[site - 1]
    }
}

/// An owner with a node of 4 units and an active reservation of 3 of them for a research
/// org, a buyer org, and a key for each; what the tests act on.
struct Market {
    owner: String,
    buyer: String,
    node: &'static str,
    reservation: String,
}

fn market(app: &App) -> Market {
    app.org("owner");
    app.org("research");
    app.org("buyer");
    let owner = app.key("owner", "capacity-manager", None);
    let buyer = app.key("buyer", "member", None);
    app.node("n1", "owner", &["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let reservation = app.reservation("n1", &["gpu-0", "gpu-1", "gpu-2"], &["research"], &[]);
    Market {
        owner: owner.token().expect("token").to_owned(),
        buyer: buyer.token().expect("token").to_owned(),
        node: "n1",
        reservation: reservation["id"].as_str().expect("id").to_owned(),
    }
}

fn release(client: &Client, market: &Market, units: &[&str]) -> api_support::Reply {
    client.post(
        &format!(
            "/v1/nodes/{}/reservations/{}/release",
            market.node, market.reservation
        ),
        &json!({ "unitIds": units }),
    )
}

fn reclaim(client: &Client, market: &Market, units: &[&str]) -> api_support::Reply {
    client.post(
        &format!(
            "/v1/nodes/{}/reservations/{}/reclaim",
            market.node, market.reservation
        ),
        &json!({ "unitIds": units }),
    )
}

/// The gRPC method a read replica forwards a program of write statements with.
const FORWARDED_PROGRAM: &str = "/proxy.Proxy/StreamExec";

/// The programs site `site`'s replica forwards to the primary while `request` runs (the
/// link's other calls, replication's, are not the request's).
fn calls_to_primary(edge: &Edge, site: usize, request: impl FnOnce()) -> usize {
    let before = edge.link(site).calls_to(FORWARDED_PROGRAM);
    request();
    edge.link(site).calls_to(FORWARDED_PROGRAM) - before
}

/// [`calls_to_primary`] for a read: the fewest of up to ten runs, stopping at the first that
/// made none. sqld's replica forwards every program, reads too, for a while whenever it
/// reloads its copy behind the primary (seen on a loaded machine for three runs in a row),
/// which is sqld's doing, not the request's; a read that crosses by itself crosses in every
/// run.
fn read_calls_to_primary(edge: &Edge, site: usize, read: impl Fn()) -> usize {
    let mut fewest = usize::MAX;
    for run in 0..10 {
        if run > 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        fewest = fewest.min(calls_to_primary(edge, site, &read));
        if fewest == 0 {
            break;
        }
    }
    fewest
}

#[test]
fn at_a_site_a_write_crosses_to_the_primary_once_and_a_read_never() {
    let edge = Edge::start(1);
    let app = edge.site(1);
    let market = market(app);
    let owner = app.client(&market.owner);
    let buyer = app.client(&market.buyer);
    // Quiet: nothing in flight opens calls by itself.
    assert_eq!(
        calls_to_primary(&edge, 1, || std::thread::sleep(Duration::from_millis(300))),
        0
    );

    let reservation_path = format!("/v1/nodes/n1/reservations/{}", market.reservation);
    let counted: Vec<(&str, usize, usize)> = vec![
        (
            "release",
            1,
            calls_to_primary(&edge, 1, || {
                release(&owner, &market, &["gpu-1", "gpu-2"]).expect_status(200);
            }),
        ),
        (
            "placement",
            1,
            calls_to_primary(&edge, 1, || {
                buyer
                    .post(
                        "/v1/vms",
                        &json!({ "nodeId": "n1", "unitIds": ["gpu-1"], "tier": "spot" }),
                    )
                    .expect_status(201);
            }),
        ),
        (
            "GET reservation",
            0,
            read_calls_to_primary(&edge, 1, || {
                owner.get(&reservation_path).expect_status(200);
            }),
        ),
        (
            "list",
            0,
            read_calls_to_primary(&edge, 1, || {
                owner.get("/v1/nodes/n1/reservations").expect_status(200);
            }),
        ),
        (
            "market",
            0,
            read_calls_to_primary(&edge, 1, || {
                buyer.get("/v1/market?nodeId=n1").expect_status(200);
            }),
        ),
        (
            "dry run",
            0,
            read_calls_to_primary(&edge, 1, || {
                owner
                    .post(
                        &format!("{reservation_path}/reclaim/dry-run"),
                        &json!({ "unitIds": ["gpu-1"] }),
                    )
                    .expect_status(200);
            }),
        ),
        (
            "reclaim",
            1,
            calls_to_primary(&edge, 1, || {
                reclaim(&owner, &market, &["gpu-1"]).expect_status(200);
            }),
        ),
        (
            "refused release (a unit not in the reservation), decided again caught up",
            1,
            calls_to_primary(&edge, 1, || {
                release(&owner, &market, &["gpu-3"]).expect_status(422);
            }),
        ),
    ];
    for (request, expected, calls) in &counted {
        eprintln!("{request}: {calls} calls to the primary (expected {expected})");
    }
    let unexpected: Vec<_> = counted
        .iter()
        .filter(|(_, expected, calls)| calls != expected)
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
}

#[test]
fn a_write_is_read_at_once_at_its_site_and_with_its_bookmark_at_another() {
    let edge = Edge::start(2);
    // Site 2 is far from the primary: its copy lags by at least a one-way trip (the delay
    // holds for what the link carries once it is set).
    edge.link(2).set_rtt(Duration::from_millis(400));
    std::thread::sleep(Duration::from_millis(500));
    let (here, there) = (edge.site(1), edge.site(2));

    let created = here
        .operator()
        .post("/v1/orgs", &json!({ "name": "Made at site 1" }))
        .expect_status(201);
    let id = created.json()["id"].as_str().expect("id").to_owned();
    let bookmark = created
        .header("bookmark")
        .expect("a write answers with its bookmark")
        .to_owned();

    // Read-your-writes at the site, with no bookmark. (sqld's replica serves reads from the
    // primary for a moment after it reloads its copy, and its own copy a moment behind right
    // after: on a loaded machine the first read may land in that window, hence the retry.)
    eventually(|| (here.operator().get(&format!("/v1/orgs/{id}")).status == 200).then_some(()));
    // At the lagging site, without the bookmark: not there yet.
    there
        .operator()
        .get(&format!("/v1/orgs/{id}"))
        .expect_status(404);
    // With it: served once the site's copy has the write.
    let started = Instant::now();
    there
        .operator()
        .with_header("bookmark", &bookmark)
        .get(&format!("/v1/orgs/{id}"))
        .expect_status(200);
    eprintln!("served with the bookmark after {:?}", started.elapsed());

    // A bookmark ahead of the primary was never answered: refused at once.
    let far_ahead = format!(
        "{:016x}",
        i64::from_str_radix(&bookmark, 16).unwrap() + 1_000
    );
    there
        .operator()
        .with_header("bookmark", &far_ahead)
        .get(&format!("/v1/orgs/{id}"))
        .expect_problem(400, "invalid-bookmark");
    // One the site cannot reach (cut off from the primary) is refused, not answered stale.
    edge.link(2).cut();
    let newer = here
        .operator()
        .post(
            "/v1/orgs",
            &json!({ "name": "Made while site 2 is cut off" }),
        )
        .expect_status(201);
    let newer_id = newer.json()["id"].as_str().expect("id").to_owned();
    let refused = there
        .operator()
        .with_header("bookmark", newer.header("bookmark").expect("a bookmark"))
        .get(&format!("/v1/orgs/{newer_id}"))
        .expect_status(503);
    // `site-behind`, or `storage-unavailable` while the replica drops what it was doing on
    // noticing the cut: either way a 503 to retry, never an older answer.
    let code = refused.json()["code"].clone();
    assert!(
        code == "site-behind" || code == "storage-unavailable",
        "{code}"
    );
    assert!(refused.header("retry-after").is_some());
    edge.link(2).restore();
    there
        .operator()
        .with_header("bookmark", "not-a-bookmark")
        .get(&format!("/v1/orgs/{id}"))
        .expect_status(400);
}

#[test]
fn a_refusal_that_lag_explains_is_decided_again_caught_up_with_the_primary() {
    let edge = Edge::start(2);
    edge.link(2).set_rtt(Duration::from_millis(400));
    std::thread::sleep(Duration::from_millis(500));
    let (here, there) = (edge.site(1), edge.site(2));
    here.operator()
        .post("/v1/orgs", &json!({ "id": "fresh", "name": "Fresh" }))
        .expect_status(201);
    // At the lagging site the org is not there yet; the key's creation would be a 404 on its
    // copy, and is decided again once the copy has caught up with the primary.
    there
        .operator()
        .post(
            "/v1/orgs/fresh/keys",
            &json!({ "name": "first", "role": "member" }),
        )
        .expect_status(201);
    // A refusal that lag does not explain stays one.
    there
        .operator()
        .post(
            "/v1/orgs/never-made/keys",
            &json!({ "name": "first", "role": "member" }),
        )
        .expect_status(404);
}

#[test]
fn a_key_revoked_at_one_site_cannot_write_at_a_site_that_has_not_heard() {
    let edge = Edge::start(2);
    let (here, there) = (edge.site(1), edge.site(2));
    let market = market(here);
    // The revocation reaches site 2 only after its link is back.
    let admin = here.key("owner", "admin", None);
    let owner_key = api_support::key_id(&here.client(&market.owner));
    edge.link(2).set_rtt(Duration::from_millis(600));
    std::thread::sleep(Duration::from_millis(700));
    admin
        .delete(&format!("/v1/orgs/owner/keys/{owner_key}"))
        .expect_status(200);
    release(&there.client(&market.owner), &market, &["gpu-1"]).expect_status(401);
    edge.link(2).set_rtt(Duration::ZERO);
    let reservation: Value = here
        .operator()
        .get(&format!("/v1/nodes/n1/reservations/{}", market.reservation))
        .expect_status(200)
        .json();
    assert_eq!(
        reservation["releasedUnitIds"],
        json!([]),
        "the revoked key changed nothing"
    );
}

#[test]
fn migrations_are_applied_once_at_the_primary_while_apps_at_every_site_start() {
    let dir = TempDir::new("edge");
    let sites = Sites::start(dir.path(), 2, Duration::from_millis(20));
    // Apps at both sites first: they find no schema, and wait for it rather than apply it.
    let at_sites: Vec<std::thread::JoinHandle<(App, u16)>> = (1..=2)
        .map(|site| {
            let config = sites.site_config(site).to_owned();
            std::thread::spawn(move || {
                let app = App::start_with_runtime_config(&config);
                let health = app.anonymous().get("/v1/healthz");
                eprintln!("a site's health: {} {}", health.status, health.text());
                (app, health.status)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let at_primary = App::start_with_runtime_config(sites.primary_config());
    at_primary.anonymous().get("/v1/healthz").expect_status(200);
    for handle in at_sites {
        let (app, status) = handle.join().expect("a site's app");
        assert_eq!(
            status, 200,
            "a site's app is healthy once the schema arrives"
        );
        let health = app.anonymous().get("/v1/healthz").expect_status(200).json();
        assert_eq!(
            health["schemaVersion"],
            reservations_store::schema::LATEST_VERSION
        );
    }
    // Applied once: the primary's version is the latest, and its every table exists once.
    let db = rusqlite::Connection::open(sites.primary.data_path()).expect("primary db");
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, reservations_store::schema::LATEST_VERSION);
}

#[test]
fn a_cut_link_fails_writes_cleanly_keeps_reads_and_a_keyed_retry_applies_once() {
    let edge = Edge::start(1);
    let app = edge.site(1);
    let market = market(app);
    let owner = app.client(&market.owner);
    let reservation_path = format!("/v1/nodes/n1/reservations/{}", market.reservation);

    edge.link(1).cut();
    let keyed = owner.with_header("idempotency-key", "release-during-the-cut");
    let refused = release(&keyed, &market, &["gpu-1"]).expect_status(503);
    assert!(refused.header("retry-after").is_some());
    // Reads go on at the site, once its replica has noticed the link gone (it drops the
    // requests in flight as it does).
    let during = eventually(|| {
        let reply = owner.get(&reservation_path);
        (reply.status == 200).then_some(reply)
    });
    assert_eq!(during.json()["releasedUnitIds"], json!([]));

    edge.link(1).restore();
    let applied = eventually(|| {
        let reply = release(&keyed, &market, &["gpu-1"]);
        (reply.status == 200).then_some(reply)
    });
    assert_eq!(applied.json()["releasedUnitIds"], json!(["gpu-1"]));
    // Once: a retry replays (after a 409 `idempotency-key-in-use`, which asks for a retry,
    // while the replica's reads still come from the primary and its copy a moment behind),
    // and the trail has one release.
    let replay = eventually(|| {
        let reply = release(&keyed, &market, &["gpu-1"]);
        match reply.status {
            409 => {
                assert_eq!(reply.json()["code"], "idempotency-key-in-use");
                None
            }
            _ => Some(reply.expect_status(200)),
        }
    });
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    eventually(|| (releases_in_trail(app) == 1).then_some(()));
    assert_eq!(releases_in_trail(app), 1);
}

#[test]
fn a_replica_or_the_primary_restarted_converges() {
    let mut edge = Edge::start(1);
    let market = market(edge.site(1));
    let owner = edge.site(1).client(&market.owner);

    edge.sites.replicas[0].kill();
    let down = release(&owner, &market, &["gpu-1"]);
    assert_eq!(down.status, 503, "{}", down.text());
    edge.sites.replicas[0].start_again();
    eventually(|| (release(&owner, &market, &["gpu-1"]).status == 200).then_some(()));

    edge.sites.primary.kill();
    let refused = release(&owner, &market, &["gpu-2"]);
    assert_eq!(refused.status, 503, "{}", refused.text());
    // The site's copy still answers reads, once its replica has noticed the primary gone (it
    // drops the requests in flight as it does).
    let read_while_down = eventually(|| {
        let reply = owner.get(&format!("/v1/nodes/n1/reservations/{}", market.reservation));
        (reply.status == 200).then_some(reply)
    });
    assert_eq!(read_while_down.json()["releasedUnitIds"], json!(["gpu-1"]));
    edge.sites.primary.start_again();
    eventually(|| (release(&owner, &market, &["gpu-2"]).status == 200).then_some(()));
    // Right after the primary restarts, sqld's replica serves reads from the primary until
    // its copy has caught up with where the primary was: the site's copy converges a moment
    // later (docs/operations.md, "Edge sites").
    eventually(|| {
        let reservation: Value = owner
            .get(&format!("/v1/nodes/n1/reservations/{}", market.reservation))
            .expect_status(200)
            .json();
        (reservation["releasedUnitIds"] == json!(["gpu-1", "gpu-2"])).then_some(())
    });
    eventually(|| (releases_in_trail(edge.site(1)) == 2).then_some(()));
}

/// How many `reservation.release` events the trail holds.
fn releases_in_trail(app: &App) -> usize {
    app.operator()
        .all_items("/v1/audit?action=reservation.release")
        .len()
}

/// `attempt` again, every 100 ms for up to 30 s, until it gives something.
fn eventually<T>(mut attempt: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = attempt() {
            return value;
        }
        assert!(Instant::now() < deadline, "did not happen within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}
