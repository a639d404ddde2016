//! The events feed as a shared resource and as a view of the audit trail: waiting polls are
//! bounded per key, per org and over the service, so that neither one key nor one org (however
//! many keys it mints) crowds out anyone else; a key revoked during a poll is refused at once;
//! a key without `audit.read` hears what happened, in no more fields than the contract's
//! summary view allows; and the cursor says nothing of other orgs' activity.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

use api_support::contract::{assert_event_fits_its_view, event_view_fields, fields_of, openapi};
use api_support::positions::{beyond_every_event, is_behind};
use api_support::stores::remote_by_default;
use api_support::{
    App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, SetOnDrop, key_id, until,
};

const NODE: &str = "n1";
const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
const BUYER: &str = "buyer";
const STRANGER: &str = "stranger";

/// As the service bounds waiting polls (`reservations_store::feed`): per key, per org, over
/// the service.
const WAITS_PER_KEY: usize = 4;
const WAITS_PER_ORG: usize = 16;
const WAITS_OVERALL: usize = 64;

/// How long a test waits for a state it needs before it fails.
const PATIENCE: Duration = Duration::from_secs(120);
/// Well inside the 30 s a revoked key's poll asks to wait: it ends when an event comes.
const REVOKED_POLL_ENDS_WITHIN: Duration = Duration::from_secs(20);
/// How long health and other callers may take to be answered while one key floods the feed:
/// a probe's patience, far above an answer's time on an idle machine, far below the flood's.
const OTHERS_ANSWERED_WITHIN: Duration = Duration::from_secs(30);

/// `owner`'s node n1 with a reservation of g0..g2 for `aud`, g1 released, and a spot VM of
/// `buyer` on it.
struct Scene {
    app: App,
    reservation: String,
    owner: Client,
    audience: Client,
    buyer: Client,
    stranger: Client,
    stranger_admin: Client,
}

impl Scene {
    fn open() -> Scene {
        let scene = Scenario::new()
            .orgs(&[OWNER, AUDIENCE, BUYER, STRANGER])
            .node(NODE, OWNER, &["g0", "g1", "g2", "g3"])
            .reservation(
                "r",
                ReservationSpec::on(NODE, &["g0", "g1", "g2"]).audience(&[AUDIENCE]),
            )
            .key("owner", OWNER, "capacity-manager")
            .key("audience", AUDIENCE, "viewer")
            .key("buyer", BUYER, "member")
            .key("stranger", STRANGER, "viewer")
            .key("stranger-admin", STRANGER, "admin")
            .release(
                ReleaseSpec::of("r", &["g1"])
                    .by("owner")
                    .reason("internal: customer escalation 4711"),
            )
            .vm("buyer", NODE, &["g1"], "spot")
            .open();
        Scene {
            reservation: scene.reservation_id("r"),
            owner: scene.client("owner"),
            audience: scene.client("audience"),
            buyer: scene.client("buyer"),
            stranger: scene.client("stranger"),
            stranger_admin: scene.client("stranger-admin"),
            app: scene.app,
        }
    }

    fn capacity(&self, action: &str, units: &[&str], reason: &str) {
        self.owner
            .post(
                &format!(
                    "/v1/nodes/{NODE}/reservations/{}/{action}",
                    self.reservation
                ),
                &json!({ "unitIds": units, "reason": reason }),
            )
            .expect_status(200);
    }
}

fn feed(client: &Client, query: &str) -> Reply {
    client.get(&format!("/v1/events{query}"))
}

fn items(page: &Value) -> Vec<Value> {
    page["items"].as_array().expect("items").clone()
}

/// The places of waiting polls held now, over the service.
fn places(app: &App) -> usize {
    app.db()
        .query_row("SELECT COUNT(*) FROM feed_waits", [], |r| {
            r.get::<_, i64>(0)
        })
        .expect("count the places") as usize
}

/// Polls sent, and how many of them were answered other than 200 so far (refused by a
/// bound: they answer at once, while those that wait answer only at their wait's end).
#[derive(Default)]
struct Polls {
    sent: Vec<JoinHandle<Reply>>,
    refused: Arc<AtomicUsize>,
}

impl Polls {
    /// `count` polls `GET /v1/events?wait=` of `client`, each on a connection of its own,
    /// sent in waves of 25 a few milliseconds apart: the polls are held together, while the
    /// host's pool of instances (shared by the suites that run beside this one) never sees
    /// them all arrive in the same instant.
    fn send(&mut self, client: &Client, count: usize, wait: u64) {
        for i in 0..count {
            if i > 0 && i % 25 == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let client = client.with_timeout(Duration::from_secs(60));
            let refused = self.refused.clone();
            self.sent.push(std::thread::spawn(move || {
                let reply = feed(
                    &client,
                    &format!("?after={}&wait={wait}", beyond_every_event()),
                );
                if reply.status != 200 {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                reply
            }));
        }
    }

    fn of(client: &Client, count: usize, wait: u64) -> Polls {
        let mut polls = Polls::default();
        polls.send(client, count, wait);
        polls
    }

    /// Waits until every poll holds a place or was refused (at least `held` places held): the
    /// state a test of the bounds looks at. How many places are held.
    fn until_settled(&self, app: &App, held: usize) -> usize {
        let mut holding = 0;
        until(
            &format!("{} polls settled, {held} holding places", self.sent.len()),
            PATIENCE,
            || {
                holding = places(app);
                holding >= held && self.refused.load(Ordering::SeqCst) + holding == self.sent.len()
            },
        );
        holding
    }

    fn answers(self) -> impl Iterator<Item = Reply> {
        self.sent
            .into_iter()
            .map(|poll| poll.join().expect("a poll"))
    }
}

/// `count` new viewer keys of `org`, minted by its admin.
fn mint_viewers(app: &App, admin: &Client, org: &str, count: usize) -> Vec<Client> {
    (0..count)
        .map(|i| {
            let created = admin
                .post(
                    &format!("/v1/orgs/{org}/keys"),
                    &json!({ "name": format!("poller {i}"), "role": "viewer" }),
                )
                .expect_status(201)
                .json();
            app.client(created["token"].as_str().expect("token"))
        })
        .collect()
}

#[test]
fn a_key_without_audit_read_hears_what_happened_but_not_the_audit_trail_s_content() {
    let scene = Scene::open();
    // The viewer key of the audience may not read the audit trail...
    scene
        .audience
        .get("/v1/audit")
        .expect_problem(403, "forbidden");
    // ...and its feed has the release, without the reason, the key and request behind it.
    let page = feed(&scene.audience, "").expect_status(200).json();
    let release = items(&page)
        .into_iter()
        .find(|e| e["action"] == "reservation.release")
        .expect("the audience hears of the release");
    assert_eq!(release["unitIds"], json!(["g1"]), "{release}");
    assert_eq!(release["view"], "summary", "{release}");
    // A key that reads the audit trail gets the whole event there as in the feed.
    let page = feed(&scene.owner, "").expect_status(200).json();
    let release = items(&page)
        .into_iter()
        .find(|e| e["action"] == "reservation.release")
        .expect("the owner hears of the release");
    assert_eq!(release["reason"], "internal: customer escalation 4711");
    assert!(release["actorKeyId"].is_string() && release["requestId"].is_string());
}

/// The kinds of event the feed carries, as the contract's `/v1/events` names them.
const FEED_KINDS: [&str; 4] = [
    "reservation.release",
    "reservation.reclaim",
    "vm.place",
    "vm.terminate",
];

#[test]
fn a_key_without_audit_read_sees_no_field_beyond_the_contract_s_summary_view_of_any_kind() {
    let scene = Scenario::new()
        .orgs(&[OWNER, AUDIENCE, BUYER])
        .node(NODE, OWNER, &["g0", "g1", "g2", "g3"])
        .reservation(
            "r",
            ReservationSpec::on(NODE, &["g0", "g1", "g2"]).audience(&[AUDIENCE]),
        )
        .key("owner", OWNER, "capacity-manager")
        .key("owner-viewer", OWNER, "viewer")
        .key("audience", AUDIENCE, "viewer")
        .key("buyer", BUYER, "member")
        .key("buyer-viewer", BUYER, "viewer")
        .release(
            ReleaseSpec::of("r", &["g1", "g2"])
                .by("owner")
                .reason("internal: customer escalation 4711"),
        )
        .vm("buyer", NODE, &["g1"], "spot")
        .vm("buyer", NODE, &["g2"], "spot")
        .open();
    let reservation = scene.reservation_path("r");
    // Every kind of event: the placements above, a reclaim that terminates the spot VM on g1
    // and a termination of the other by its own org.
    scene
        .client("owner")
        .post(
            &format!("{reservation}/reclaim"),
            &json!({ "unitIds": ["g1"], "reason": "internal: training run" }),
        )
        .expect_status(200);
    let buyer = scene.client("buyer");
    let running = buyer
        .get("/v1/vms?status=running")
        .expect_status(200)
        .json();
    let vm = running["items"][0]["id"].as_str().expect("a running VM");
    buyer.delete(&format!("/v1/vms/{vm}")).expect_status(200);
    let contract = openapi();
    let description = contract["paths"]["/v1/events"]["get"]["description"]
        .as_str()
        .expect("the feed's description");
    for kind in FEED_KINDS {
        assert!(description.contains(&format!("`{kind}`")), "{kind}");
    }

    let mut kinds_seen = BTreeSet::new();
    for name in ["owner-viewer", "audience", "buyer-viewer"] {
        let key = scene.client(name);
        key.get("/v1/audit").expect_problem(403, "forbidden");
        let page = feed(&key, "?limit=1000").expect_status(200).json();
        for event in items(&page) {
            assert_event_fits_its_view(name, &event);
            kinds_seen.insert(event["action"].as_str().expect("action").to_owned());
        }
    }
    assert_eq!(
        kinds_seen,
        FEED_KINDS.iter().map(|k| k.to_string()).collect(),
        "every kind of event was seen by a key without audit.read"
    );
    // The check can fail: a key that reads the audit trail gets fields the summary has not.
    let (summary, _) = event_view_fields("summary");
    let page = feed(&scene.client("owner"), "?limit=1000")
        .expect_status(200)
        .json();
    for event in items(&page) {
        assert!(
            !fields_of(&event).is_subset(&summary),
            "an event read with audit.read fits the summary view: {event}"
        );
    }
}

#[test]
fn the_feed_s_cursor_says_nothing_of_other_orgs_activity() {
    let scene = Scene::open();
    let cursor_of = |client: &Client, query: &str| -> String {
        feed(client, query).expect_status(200).json()["nextCursor"]
            .as_str()
            .expect("nextCursor")
            .to_owned()
    };
    // A stranger's cursor stands at its own last event (its key's creation), behind the
    // trail's head, and stays there however busy the market is.
    let stranger_cursor = cursor_of(&scene.stranger, "");
    let head = cursor_of(&scene.app.operator(), "");
    assert!(
        is_behind(&stranger_cursor, &head),
        "stranger {stranger_cursor}, head {head}"
    );
    scene.capacity("reclaim", &["g1"], "training starts");
    scene.capacity("release", &["g2"], "idle again");
    assert_eq!(cursor_of(&scene.stranger, "?after=p0"), stranger_cursor);
    assert_eq!(
        cursor_of(&scene.stranger, &format!("?after={stranger_cursor}&wait=1")),
        stranger_cursor
    );
    // The buyer's cursor moves to its own last event, not to the trail's head.
    let buyer_cursor = cursor_of(&scene.buyer, "");
    let head = cursor_of(&scene.app.operator(), "");
    assert!(
        is_behind(&buyer_cursor, &head),
        "buyer {buyer_cursor}, head {head}"
    );
}

#[test]
fn a_key_revoked_during_a_long_poll_is_refused_and_hears_nothing_written_after() {
    let scene = Scene::open();
    let cursor = feed(&scene.audience, "").expect_status(200).json()["nextCursor"]
        .as_str()
        .expect("nextCursor")
        .to_owned();
    let waiting = {
        let audience = scene.audience.clone();
        std::thread::spawn(move || feed(&audience, &format!("?after={cursor}&wait=30")))
    };
    let audience_key = key_id(&scene.audience);
    until("the poll waits", PATIENCE, || {
        scene.app.feed_waits_of(&audience_key) == 1
    });
    scene
        .app
        .operator()
        .delete(&format!(
            "/v1/orgs/{AUDIENCE}/keys/{}",
            key_id(&scene.audience)
        ))
        .expect_status(200);
    // An event the key would have seen, written after the revocation, ends the poll: it is
    // answered long before its 30 s wait would have run out.
    scene.capacity("release", &["g2"], "after the revocation");
    until(
        "the revoked key's poll is answered",
        REVOKED_POLL_ENDS_WITHIN,
        || waiting.is_finished(),
    );
    let answer = waiting.join().expect("the long poll");
    answer.expect_problem(401, "unauthorized");
}

/// Callers other than a busy key: health, another org's reads, another org's write.
fn others_are_served(scene: &Scene, what: &str) {
    let bounded = |client: &Client| client.with_timeout(OTHERS_ANSWERED_WITHIN);
    let health = bounded(&scene.app.anonymous()).get("/v1/healthz");
    assert_eq!(health.status, 200, "{what}: healthz: {}", health.text());
    let vms = bounded(&scene.buyer).get("/v1/vms");
    assert_eq!(
        vms.status,
        200,
        "{what}: another key's read: {}",
        vms.text()
    );
    let page = feed(&bounded(&scene.owner), "?wait=0");
    assert_eq!(
        page.status,
        200,
        "{what}: another key's feed: {}",
        page.text()
    );
    let write = bounded(&scene.owner).post(
        &format!(
            "/v1/nodes/{NODE}/reservations/{}/release",
            scene.reservation
        ),
        &json!({ "unitIds": ["g0"] }),
    );
    assert_eq!(write.status, 200, "{what}: a write: {}", write.text());
}

/// A refusal of a bound: `status` and `code`, with a Retry-After within the longest wait.
fn refused_by_bound(reply: Reply, status: u16, code: &str) {
    let retry_after: u64 = reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {}", reply.text()))
        .parse()
        .expect("seconds");
    assert!((1..=32).contains(&retry_after), "{retry_after}");
    reply.expect_problem(status, code);
}

#[test]
fn one_key_s_waiting_polls_are_bounded_and_never_crowd_out_other_callers() {
    let _machine = api_support::machine_to_itself();
    let scene = Scene::open();
    // Long enough a wait that all 1 100 are sent while the first are still held, however
    // loaded the machine.
    let polls = Polls::of(&scene.stranger, 1100, 15);
    // While the key's polls are held, everyone else is served.
    assert_eq!(
        polls.until_settled(&scene.app, WAITS_PER_KEY),
        WAITS_PER_KEY
    );
    others_are_served(&scene, "while 1 100 polls of one key are held");
    let (mut waited, mut refused, mut unavailable) = (0, 0, 0);
    for reply in polls.answers() {
        match reply.status {
            200 => waited += 1,
            429 => {
                refused_by_bound(reply, 429, "too-many-waits");
                refused += 1;
            }
            // 1 100 requests at once exceed sqld's own bounds (128 connections, 128 requests
            // in flight) for longer than the app retries: a poll may then be answered 503 of
            // its own, which took no place (the places held were counted above).
            503 if remote_by_default() => {
                let code = reply.json()["code"].as_str().unwrap_or_default().to_owned();
                assert!(
                    code == "database-busy" || code == "storage-unavailable",
                    "{}",
                    reply.text()
                );
                refused_by_bound(reply, 503, &code);
                unavailable += 1;
            }
            status => panic!("a poll answered {status}: {}", reply.text()),
        }
    }
    assert_eq!(
        (waited, refused + unavailable),
        (WAITS_PER_KEY, 1100 - WAITS_PER_KEY),
        "{unavailable} answered 503"
    );
    // Their places given back, the key may wait again.
    for reply in Polls::of(&scene.stranger, WAITS_PER_KEY, 1).answers() {
        reply.expect_status(200);
    }

    // Clients that hang up: their instances run out their wait (as under Spin, which does not
    // stop a guest whose client went away), holding only their own key's places.
    let request = format!(
        "GET /v1/events?after={}&wait=4 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        beyond_every_event(),
        scene.stranger.token().expect("a token")
    );
    let addr = scene.app.base.trim_start_matches("http://").to_owned();
    // Health is asked throughout the flood, each answer within a probe's patience.
    let sending = AtomicBool::new(true);
    let health = std::thread::scope(|scope| {
        let done = SetOnDrop::new(&sending, false);
        let prober = scope.spawn(|| {
            let probe = scene.app.anonymous().with_timeout(OTHERS_ANSWERED_WITHIN);
            let mut statuses = Vec::new();
            while sending.load(Ordering::SeqCst) || statuses.is_empty() {
                statuses.push(probe.get("/v1/healthz").status);
                std::thread::sleep(Duration::from_millis(100));
            }
            statuses
        });
        for i in 0..1100 {
            if i > 0 && i % 25 == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let mut stream = TcpStream::connect(&addr).expect("connect");
            stream.write_all(request.as_bytes()).expect("send");
            drop(stream);
        }
        drop(done);
        prober.join().expect("the health prober")
    });
    assert!(
        health.iter().all(|status| *status == 200),
        "health during the flood of hung-up polls: {health:?}"
    );
    let stranger = key_id(&scene.stranger);
    until("the hung-up polls hold the key's places", PATIENCE, || {
        scene.app.feed_waits_of(&stranger) == WAITS_PER_KEY as i64
    });
    others_are_served(&scene, "after 1 100 polls hung up");
    // Once their waits are over, the key's places are free again.
    until("the hung-up polls' places given back", PATIENCE, || {
        scene.app.feed_waits_of(&stranger) == 0
    });
    until("the key may wait again", PATIENCE, || {
        let reply = feed(
            &scene.stranger,
            &format!("?after={}&wait=1", beyond_every_event()),
        );
        assert!(matches!(reply.status, 200 | 429), "{}", reply.text());
        reply.status == 200
    });
}

#[test]
fn one_org_s_keys_together_hold_at_most_its_share_and_other_orgs_still_wait() {
    let _machine = api_support::machine_to_itself();
    let scene = Scene::open();
    // An org's admin mints as many keys as it likes, each of which may hold its own places:
    // enough to hold every place of the service.
    let keys = mint_viewers(
        &scene.app,
        &scene.stranger_admin,
        STRANGER,
        WAITS_OVERALL / WAITS_PER_KEY,
    );
    let mut polls = Polls::default();
    for key in &keys {
        polls.send(key, WAITS_PER_KEY, 15);
    }
    let held = polls.until_settled(&scene.app, WAITS_PER_ORG);
    // Another org's long poll still takes a place, and waits out its wait.
    let other = feed(
        &scene.audience,
        &format!("?after={}&wait=1", beyond_every_event()),
    );
    assert_eq!(other.status, 200, "another org's poll: {}", other.text());
    assert_eq!(held, WAITS_PER_ORG, "places the org's polls hold");
    others_are_served(&scene, "while one org holds its share of the places");
    let (mut waited, mut refused) = (0, 0);
    for reply in polls.answers() {
        match reply.status {
            200 => waited += 1,
            429 => {
                refused_by_bound(reply, 429, "too-many-org-waits");
                refused += 1;
            }
            status => panic!("a poll answered {status}: {}", reply.text()),
        }
    }
    assert_eq!(
        (waited, refused),
        (WAITS_PER_ORG, WAITS_OVERALL - WAITS_PER_ORG)
    );
}

#[test]
fn waiting_polls_over_the_whole_service_are_bounded_with_a_503() {
    let _machine = api_support::machine_to_itself();
    let scene = Scene::open();
    // Orgs that each hold their share, one more than the service has room for.
    let orgs = WAITS_OVERALL / WAITS_PER_ORG + 1;
    let keys: Vec<Client> = (0..orgs)
        .flat_map(|org| {
            let org = format!("crowd-{org}");
            scene.app.org(&org);
            (0..WAITS_PER_ORG / WAITS_PER_KEY)
                .map(|_| scene.app.key(&org, "viewer", None))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut polls = Polls::default();
    for key in &keys {
        polls.send(key, WAITS_PER_KEY, 15);
    }
    assert_eq!(
        polls.until_settled(&scene.app, WAITS_OVERALL),
        WAITS_OVERALL
    );
    others_are_served(&scene, "while the service holds all its waits");
    let (mut waited, mut exhausted) = (0, 0);
    for reply in polls.answers() {
        match reply.status {
            200 => waited += 1,
            503 => {
                refused_by_bound(reply, 503, "waits-exhausted");
                exhausted += 1;
            }
            status => panic!("a poll answered {status}: {}", reply.text()),
        }
    }
    assert_eq!((waited, exhausted), (WAITS_OVERALL, WAITS_PER_ORG));
}

#[test]
fn a_poll_with_nothing_to_wait_for_takes_no_place() {
    let scene = Scene::open();
    let held = Polls::of(&scene.audience, WAITS_PER_KEY, 3);
    let audience = key_id(&scene.audience);
    until("the key's polls hold its places", PATIENCE, || {
        scene.app.feed_waits_of(&audience) == WAITS_PER_KEY as i64
    });
    // A key that holds all its places is refused another wait before anything is read, even
    // with events there to read; without a wait it reads them at once.
    refused_by_bound(feed(&scene.audience, "?wait=3"), 429, "too-many-waits");
    let page = feed(&scene.audience, "?wait=0").expect_status(200).json();
    assert!(!items(&page).is_empty());
    for reply in held.answers() {
        reply.expect_status(200);
    }
    // Events there already: a poll with a wait answers at once, and takes no place.
    let page = feed(&scene.audience, "?wait=3").expect_status(200).json();
    assert!(!items(&page).is_empty());
    let places: i64 = scene
        .app
        .db()
        .query_row("SELECT COUNT(*) FROM feed_waits", [], |r| r.get(0))
        .expect("count");
    assert_eq!(places, 0, "every place was given back");
}
