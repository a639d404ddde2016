//! Edge sites (docs/design.md, "Edge sites" and "Writes at home"): one sqld primary with the
//! home app beside it, a read replica per site whose gRPC to the primary crosses a [`Link`]
//! (delay, cut, calls counted), and the app at each site on its replica, forwarding its
//! writes to the home across a link of its own. What is asserted: no request sends a program
//! through a replica, a site's writes reach the home on one kept connection, read-your-writes
//! at a site, bookmarks across sites, a write at a lagging site decided at home, a key
//! revoked elsewhere refused at home, a forwarded write sent again never applied twice, no
//! forwarding in a loop, migrations applied once while apps at every site start, and the
//! faults of the topology (the home out of reach, a link cut and restored, a replica or the
//! primary killed and restarted): writes fail cleanly and apply once when retried, reads go
//! on at the site, and everything converges.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use api_support::link::Link;
use api_support::positions::cells_under_test;
use api_support::stores::Sites;
use api_support::{App, Client, TempDir};
use reservations_store::cells::{Cell, Cells};

/// The node the tests act on: at home in the directory's cell with one cell and with up to
/// four (`TEST_CELLS`), so that the links and copies they watch are the ones its requests
/// cross, whatever the deployment's cells.
const NODE: &str = "n9";

/// An edge deployment with the app at each site, of a market in `TEST_CELLS` cells.
struct Edge {
    sites: Sites,
    /// The app beside the primaries, where every site's writes run.
    home: App,
    /// Each site's link to the home.
    to_home: Vec<Link>,
    apps: Vec<App>,
    _dir: TempDir,
}

impl Edge {
    /// `count` sites, the schema migrated by an app at the primary first.
    fn start(count: usize) -> Edge {
        let dir = TempDir::new("edge");
        let cells = cells_under_test();
        assert_eq!(
            Cells::new(cells).expect("cells under test").home_of(NODE),
            Cell::DIRECTORY,
            "the node the tests watch is at home in the directory's cell"
        );
        let sites = Sites::start_in_cells(dir.path(), count, Duration::ZERO, cells);
        let home = App::start_with_runtime_config(sites.primary_config());
        home.anonymous().get("/v1/healthz").expect_status(200);
        let to_home: Vec<Link> = (1..=count)
            .map(|_| Link::start(home.port(), Duration::ZERO).expect("a link to the home"))
            .collect();
        let apps: Vec<App> = (1..=count)
            .map(|site| App::start_at_site(sites.site_config(site), &to_home[site - 1].url()))
            .collect();
        for app in &apps {
            app.anonymous().get("/v1/healthz").expect_status(200);
        }
        Edge {
            sites,
            home,
            to_home,
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

    /// The position of site `site`'s copy, read from its file.
    fn site_position(&self, site: usize) -> i64 {
        self.sites.replicas[site - 1].position()
    }

    /// Sets the round trip of site `site`'s link to `rtt` once its copy has everything the
    /// primary has, so that nothing is in flight under the delay it had: what the link
    /// carries from then on takes the new one.
    fn delay_site(&self, site: usize, rtt: Duration) {
        api_support::until(
            &format!("site {site}'s copy has the primary's position"),
            Duration::from_secs(30),
            || {
                self.sites.replicas[site - 1].position_if_any()
                    == Some(self.sites.primary.position())
            },
        );
        self.link(site).set_rtt(rtt);
    }

    /// Asserts that site `site`'s copy is behind the primary now, both read from their files.
    #[track_caller]
    fn assert_site_behind(&self, site: usize) {
        let (there, primary) = (self.site_position(site), self.sites.primary.position());
        assert!(
            there < primary,
            "site {site}'s copy is at {there}, not behind the primary's {primary}"
        );
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
    app.node(NODE, "owner", &["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let reservation = app.reservation(NODE, &["gpu-0", "gpu-1", "gpu-2"], &["research"], &[]);
    Market {
        owner: owner.token().expect("token").to_owned(),
        buyer: buyer.token().expect("token").to_owned(),
        node: NODE,
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

/// The calls on which sqld's read replica forwards programs to its primary, one message per
/// program: an `ExecReq` on its `StreamExec` call (field 2, `execute`, carries a program;
/// field 3, `describe`, asks for a statement's description), or the `ProgramReq` of an
/// `Execute` call (field 2, `pgm`), which 0.24 keeps for older replicas.
const FORWARDING_CALLS: [&str; 2] = ["/proxy.Proxy/StreamExec", "/proxy.Proxy/Execute"];
const PROGRAM_FIELD: u32 = 2;

/// The call with which a replica greets its primary when it loads its database.
const HANDSHAKE: &str = "/wal_log.ReplicationLog/Hello";

/// The programs site `site`'s replica has forwarded to the primary so far (a message that
/// cannot be read counts as one, so that nothing unread passes for nothing forwarded).
fn programs_forwarded(edge: &Edge, site: usize) -> usize {
    edge.link(site)
        .messages()
        .iter()
        .filter(|m| FORWARDING_CALLS.contains(&m.path.as_str()))
        .filter(|m| m.fields.as_ref().is_none_or(|f| f.contains(&PROGRAM_FIELD)))
        .count()
}

/// The programs site `site`'s replica forwards to the primary while `request` runs (the
/// link's other calls, replication's, are not the request's).
fn calls_to_primary(edge: &Edge, site: usize, request: impl FnOnce()) -> usize {
    let before = programs_forwarded(edge, site);
    request();
    programs_forwarded(edge, site) - before
}

/// How many times each read is counted: every run must forward nothing.
const READ_RUNS: usize = 5;

/// The programs a read forwards, in each of [`READ_RUNS`] runs. From the moment sqld's
/// replica loads its database (greeting the primary, [`HANDSHAKE`]) until its copy has
/// reached where the primary was then, it forwards every program, reads too: sqld's doing,
/// not the read's. A run that forwarded programs after a greeting not yet accounted for
/// (`greetings`, the count of them seen) is that; it is left out, the copy is waited for until
/// it has the primary's position, and the read runs again. Any other run that forwards a
/// program is counted as the read's, so a read that crosses now and then fails.
fn read_calls_to_primary(
    edge: &Edge,
    site: usize,
    greetings: &std::cell::Cell<usize>,
    read: impl Fn(),
) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut left_out = 0;
    while runs.len() < READ_RUNS {
        let forwarded = calls_to_primary(edge, site, &read);
        let greeted = edge.link(site).calls_to(HANDSHAKE);
        if forwarded > 0 && greeted > greetings.get() {
            left_out += 1;
            assert!(
                left_out <= 3,
                "the replica greeted its primary again and again ({greeted} times)"
            );
            eprintln!(
                "a run forwarded {forwarded} programs after the replica loaded its database: \
                 waiting for its copy to catch up, then running the read again"
            );
            api_support::until(
                "the site's copy has the primary's position",
                Duration::from_secs(30),
                || edge.site_position(site) >= edge.sites.primary.position(),
            );
            greetings.set(greeted);
            continue;
        }
        runs.push(forwarded);
    }
    runs
}

#[test]
fn the_count_is_of_programs_forwarded_not_of_calls() {
    let edge = Edge::start(1);
    // Two write programs on one stream of the site's replica (one connection of sqld's, so
    // one forwarding call): counted two. The statement is the app's own probe of whether a
    // database forwards writes, which fails at the primary and writes nothing.
    let probe = json!({ "type": "execute", "stmt": { "sql": "INSERT INTO site_probe_no_such_table (probe) VALUES (NULL)" } });
    let calls_before = edge.link(1).calls_to(FORWARDING_CALLS[0]);
    let programs = calls_to_primary(&edge, 1, || {
        let reply = api_support::http::post_json(
            &format!("{}/v2/pipeline", edge.sites.replicas[0].url()),
            &json!({ "requests": [probe, probe, { "type": "close" }] }),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        let results = &reply.json()["results"];
        assert!(
            (0..2).all(|i| results[i]["type"] == "error"),
            "both programs ran, and failed at the primary: {results}"
        );
    });
    let calls = edge.link(1).calls_to(FORWARDING_CALLS[0]) - calls_before;
    eprintln!("two programs on one stream: {programs} programs forwarded on {calls} calls");
    assert_eq!(programs, 2, "two programs were forwarded, on {calls} calls");
}

#[test]
fn at_a_site_no_request_sends_a_program_through_the_replica_and_writes_keep_one_connection_home() {
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
    let greetings = std::cell::Cell::new(edge.link(1).calls_to(HANDSHAKE));

    let reservation_path = format!("/v1/nodes/{NODE}/reservations/{}", market.reservation);
    let write = |calls: usize| vec![calls];
    let counted: Vec<(&str, usize, Vec<usize>)> = vec![
        (
            "release",
            0,
            write(calls_to_primary(&edge, 1, || {
                release(&owner, &market, &["gpu-1", "gpu-2"]).expect_status(200);
            })),
        ),
        (
            "placement",
            0,
            write(calls_to_primary(&edge, 1, || {
                buyer
                    .post(
                        "/v1/vms",
                        &json!({ "nodeId": NODE, "unitIds": ["gpu-1"], "tier": "spot" }),
                    )
                    .expect_status(201);
            })),
        ),
        (
            "GET reservation",
            0,
            read_calls_to_primary(&edge, 1, &greetings, || {
                owner.get(&reservation_path).expect_status(200);
            }),
        ),
        (
            "list",
            0,
            read_calls_to_primary(&edge, 1, &greetings, || {
                owner
                    .get(&format!("/v1/nodes/{NODE}/reservations"))
                    .expect_status(200);
            }),
        ),
        (
            "market",
            0,
            read_calls_to_primary(&edge, 1, &greetings, || {
                buyer
                    .get(&format!("/v1/market?nodeId={NODE}"))
                    .expect_status(200);
            }),
        ),
        (
            "dry run",
            0,
            read_calls_to_primary(&edge, 1, &greetings, || {
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
            0,
            write(calls_to_primary(&edge, 1, || {
                reclaim(&owner, &market, &["gpu-1"]).expect_status(200);
            })),
        ),
        (
            "refused release (a unit not in the reservation), decided at home",
            0,
            write(calls_to_primary(&edge, 1, || {
                release(&owner, &market, &["gpu-3"]).expect_status(422);
            })),
        ),
    ];
    for (request, expected, runs) in &counted {
        eprintln!(
            "{request}: {runs:?} programs forwarded to the primary (expected {expected} each)"
        );
    }
    eprintln!("the link's calls: {:?}", edge.link(1).calls());
    let unexpected: Vec<_> = counted
        .iter()
        .filter(|(_, expected, runs)| runs.iter().any(|calls| calls != expected))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
    // The four writes went home on the connection the first opened (the market's setup
    // opened it): one connection from the site to the home in all.
    assert_eq!(edge.to_home[0].connections(), 1, "connections to the home");
}

#[test]
fn a_write_is_read_at_once_at_its_site_and_with_its_bookmark_at_another() {
    let edge = Edge::start(2);
    // Both sites are away from the primary, so their copies lag behind it: site 1's by a
    // one-way trip of 150 ms, site 2's (far) by 1.2 s (the delay holds for what the link
    // carries once it is set).
    edge.delay_site(1, Duration::from_millis(300));
    edge.delay_site(2, Duration::from_millis(2400));
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

    // Read-your-writes at the site, with no bookmark: the one read right after the answer
    // sees the write, although the site's copy lags behind the primary.
    here.operator()
        .get(&format!("/v1/orgs/{id}"))
        .expect_status(200);
    // At the lagging site, without the bookmark: not there yet.
    edge.assert_site_behind(2);
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

    // A bookmark this API did not seal (here, moved ahead of the primary) is refused at once.
    let far_ahead = api_support::positions::ahead_of(&bookmark, 1_000);
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
fn a_write_at_a_lagging_site_is_decided_at_home() {
    let edge = Edge::start(2);
    edge.delay_site(2, Duration::from_millis(1000));
    let (here, there) = (edge.site(1), edge.site(2));
    here.operator()
        .post("/v1/orgs", &json!({ "id": "fresh", "name": "Fresh" }))
        .expect_status(201);
    // At the lagging site the org is not there yet; the key's creation is decided at home,
    // where it is, and nothing goes through the site's replica.
    edge.assert_site_behind(2);
    let forwarded = calls_to_primary(&edge, 2, || {
        there
            .operator()
            .post(
                "/v1/orgs/fresh/keys",
                &json!({ "name": "first", "role": "member" }),
            )
            .expect_status(201);
    });
    assert_eq!(forwarded, 0, "programs the site's replica forwarded");
    there
        .operator()
        .post(
            "/v1/orgs/never-made/keys",
            &json!({ "name": "first", "role": "member" }),
        )
        .expect_status(404);
}

#[test]
fn a_forwarded_write_sent_again_is_replayed_and_a_client_cannot_pass_for_a_forwarder() {
    let edge = Edge::start(1);
    let market = market(edge.site(1));
    let path = format!(
        "/v1/nodes/{NODE}/reservations/{}/release",
        market.reservation
    );
    let body = json!({ "unitIds": ["gpu-1"] });
    let owner = edge.home.client(&market.owner);
    let forwarded = |id: &str, own_key: &str, resent: bool, audit_key: &str| {
        let tag = reservations_http::forward::tag(audit_key.as_bytes(), id, Some(own_key), resent);
        let sent = owner
            .with_header("forwarded-write", &format!("{id}.{tag}"))
            .with_header("forwarded-write-key", own_key);
        match resent {
            true => sent.with_header("forwarded-write-resent", "1"),
            false => sent,
        }
    };
    // Sent as a site sends it, then again as if its answer had been lost: the home replays
    // the first answer, and the trail has one release.
    let first = forwarded("req-site-1", "own-1", false, api_support::AUDIT_KEY)
        .post(&path, &body)
        .expect_status(200);
    let again = forwarded("req-site-1", "own-1", true, api_support::AUDIT_KEY)
        .post(&path, &body)
        .expect_status(200);
    assert_eq!(again.json(), first.json());
    assert_eq!(releases_in_trail(&edge.home), 1);
    // A tag made without the audit key is no forwarder's: the own key counts for nothing, so
    // the request is carried out as sent, not replayed.
    let forged = forwarded("req-site-2", "own-1", true, "a guess")
        .post(&path, &body)
        .expect_status(200);
    assert_eq!(forged.header("idempotent-replayed"), None);
    assert_ne!(forged.header("x-request-id"), first.header("x-request-id"));
    // A request a forwarder tagged that reaches an app that is not home is refused, never
    // sent on: no loop. (A 508 is a deployment's misconfiguration, which the API's contract
    // does not list.)
    let site_owner = edge.site(1).client(&market.owner).without_contract();
    let tag = reservations_http::forward::tag(
        api_support::AUDIT_KEY.as_bytes(),
        "req-site-3",
        None,
        false,
    );
    site_owner
        .with_header("forwarded-write", &format!("req-site-3.{tag}"))
        .post(&path, &json!({ "unitIds": ["gpu-2"] }))
        .expect_problem(508, "forwarding-loop");
    // The same with a tag a client made is forwarded as any request.
    site_owner
        .with_header(
            "forwarded-write",
            "req-site-4.0123456789abcdef0123456789abcdef",
        )
        .post(&path, &json!({ "unitIds": ["gpu-2"] }))
        .expect_status(200);
}

#[test]
fn a_key_revoked_at_one_site_cannot_write_at_a_site_that_has_not_heard() {
    let edge = Edge::start(2);
    let (here, there) = (edge.site(1), edge.site(2));
    let market = market(here);
    // The revocation reaches site 2 only after its link is back.
    let admin = here.key("owner", "admin", None);
    let owner_key = api_support::key_id(&here.client(&market.owner));
    edge.delay_site(2, Duration::from_millis(600));
    admin
        .delete(&format!("/v1/orgs/owner/keys/{owner_key}"))
        .expect_status(200);
    // Site 2 has not heard: its copy still has the key.
    edge.assert_site_behind(2);
    release(&there.client(&market.owner), &market, &["gpu-1"]).expect_status(401);
    edge.link(2).set_rtt(Duration::ZERO);
    let reservation: Value = here
        .operator()
        .get(&format!(
            "/v1/nodes/{NODE}/reservations/{}",
            market.reservation
        ))
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
    let at_sites: Vec<App> = (1..=2)
        .map(|site| App::start_with_runtime_config(sites.site_config(site)))
        .collect();
    std::thread::scope(|scope| {
        let started: Vec<u64> = at_sites
            .iter()
            .map(|app| app.sqlite_statements().statements)
            .collect();
        let healths: Vec<_> = at_sites
            .iter()
            .map(|app| {
                let client = app.anonymous();
                scope.spawn(move || client.get("/v1/healthz"))
            })
            .collect();
        // Each site's app has read the schema's version, learned that its writes are
        // forwarded (its probe insert failed at the primary), and read the version again:
        // it is waiting, and none has answered.
        api_support::until(
            "each site's app waits for the schema",
            Duration::from_secs(10),
            || {
                at_sites
                    .iter()
                    .zip(&started)
                    .all(|(app, started)| app.sqlite_statements().statements >= started + 4)
            },
        );
        assert!(
            healths.iter().all(|health| !health.is_finished()),
            "a site's app answered before the primary had a schema"
        );
        let at_primary = App::start_with_runtime_config(sites.primary_config());
        at_primary.anonymous().get("/v1/healthz").expect_status(200);
        for health in healths {
            let health = health.join().expect("a site's health");
            assert_eq!(
                health.status,
                200,
                "a site's app is healthy once the schema arrives: {}",
                health.text()
            );
            assert_eq!(
                health.json()["schemaVersion"],
                reservations_store::schema::LATEST_VERSION
            );
        }
    });
    // Applied once: the primary has the latest version and every object of the schema,
    // exactly as a fresh database migrated here has them, and what the migrations wrote (as
    // many rows in each table: none, on an empty trail); the sites' copies have the same.
    let reference_dir = TempDir::new("reference-schema");
    let reference_path = reference_dir.path().join("db.sqlite");
    let reference =
        reservations_store::native::NativeDb::open(&reference_path).expect("a fresh database");
    reservations_store::schema::migrate(&reference).expect("migrate a fresh database");
    let expected = schema_of(&reference_path);
    assert!(
        expected.0.len() > 10 && expected.2 == reservations_store::schema::LATEST_VERSION,
        "the reference has the schema: {expected:#?}"
    );
    let at_primary = schema_of(&sites.primary.data_path());
    assert_eq!(at_primary, expected, "the primary's schema");
    for replica in &sites.replicas {
        api_support::until(
            "a site's copy has the schema",
            Duration::from_secs(10),
            || schema_of(&replica.data_path()) == expected,
        );
    }
}

/// A database's schema and what the migrations wrote: every object (kind, name, table; not
/// its SQL, which sqld stores as it renders it again, without comments), each table's row
/// count, and its version.
#[allow(clippy::type_complexity)]
fn schema_of(path: &std::path::Path) -> (Vec<(String, String, String)>, Vec<(String, i64)>, i64) {
    let db = rusqlite::Connection::open(path).expect("open the database");
    db.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    let objects: Vec<(String, String, String)> = db
        .prepare(
            "SELECT type, name, tbl_name FROM sqlite_master \
             WHERE name NOT LIKE 'sqlite_%' AND name NOT LIKE 'libsql_%' ORDER BY type, name",
        )
        .expect("objects")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("objects")
        .collect::<Result<_, _>>()
        .expect("objects");
    let rows = objects
        .iter()
        .filter(|(kind, ..)| kind == "table")
        .map(|(_, name, ..)| {
            let count: i64 = db
                .query_row(&format!("SELECT COUNT(*) FROM \"{name}\""), [], |r| {
                    r.get(0)
                })
                .expect("a table's rows");
            (name.clone(), count)
        })
        .collect();
    let version = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    (objects, rows, version)
}

#[test]
fn the_home_out_of_reach_fails_writes_cleanly_keeps_reads_and_a_keyed_retry_applies_once() {
    let edge = Edge::start(1);
    let app = edge.site(1);
    let market = market(app);
    let owner = app.client(&market.owner);
    let reservation_path = format!("/v1/nodes/{NODE}/reservations/{}", market.reservation);

    edge.to_home[0].cut();
    let keyed = owner.with_header("idempotency-key", "release-during-the-cut");
    let refused = release(&keyed, &market, &["gpu-1"]).expect_status(503);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.json()["code"], "storage-unavailable");
    // Reads go on at the site.
    let during = owner.get(&reservation_path).expect_status(200);
    assert_eq!(during.json()["releasedUnitIds"], json!([]));

    edge.to_home[0].restore();
    let applied = release(&keyed, &market, &["gpu-1"]).expect_status(200);
    assert_eq!(applied.json()["releasedUnitIds"], json!(["gpu-1"]));
    // Once: a retry replays, and the trail has one release.
    let replay = release(&keyed, &market, &["gpu-1"]).expect_status(200);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(releases_in_trail(app), 1);
    // The site's link to its primary cut: writes still run at home, and the site answers
    // once its copy has them, or, cut off, after waiting for it a while; either way done once.
    edge.link(1).cut();
    release(&owner, &market, &["gpu-2"]).expect_status(200);
    edge.link(1).restore();
    eventually(|| (releases_in_trail(app) == 2).then_some(()));
}

#[test]
fn a_replica_or_the_primary_restarted_converges() {
    let mut edge = Edge::start(1);
    let market = market(edge.site(1));
    let owner = edge.site(1).client(&market.owner);

    // The site's replica down: its writes still run at home; its reads wait for it.
    edge.sites.replicas[0].kill();
    release(&owner, &market, &["gpu-1"]).expect_status(200);
    let down = owner.get(&format!(
        "/v1/nodes/{NODE}/reservations/{}",
        market.reservation
    ));
    assert_eq!(down.status, 503, "{}", down.text());
    edge.sites.replicas[0].start_again();
    eventually(|| {
        let reply = owner.get(&format!(
            "/v1/nodes/{NODE}/reservations/{}",
            market.reservation
        ));
        (reply.status == 200 && reply.json()["releasedUnitIds"] == json!(["gpu-1"])).then_some(())
    });

    edge.sites.primary.kill();
    let refused = release(&owner, &market, &["gpu-2"]);
    assert_eq!(refused.status, 503, "{}", refused.text());
    // The site's copy still answers reads, once its replica has noticed the primary gone (it
    // drops the requests in flight as it does).
    let read_while_down = eventually(|| {
        let reply = owner.get(&format!(
            "/v1/nodes/{NODE}/reservations/{}",
            market.reservation
        ));
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
            .get(&format!(
                "/v1/nodes/{NODE}/reservations/{}",
                market.reservation
            ))
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
