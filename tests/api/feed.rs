//! The events feed as a shared resource and as a view of the audit trail: waiting polls are
//! bounded per key and over the service, so that one key never crowds out anyone else; a key
//! revoked during a poll is refused at once; a key without `audit.read` hears what happened,
//! not the audit trail's content; and the cursor says nothing of other orgs' activity.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use api_support::stores::remote_by_default;
use api_support::{App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario};

const NODE: &str = "n1";
const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
const BUYER: &str = "buyer";
const STRANGER: &str = "stranger";

/// Per key, as the service bounds waiting polls (`reservations_store::feed`).
const WAITS_PER_KEY: usize = 4;
const WAITS_OVERALL: usize = 64;

/// `owner`'s node n1 with a reservation of g0..g2 for `aud`, g1 released, and a spot VM of
/// `buyer` on it.
struct Scene {
    app: App,
    reservation: String,
    owner: Client,
    audience: Client,
    buyer: Client,
    stranger: Client,
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

/// The key id of a client's `gpr.<keyId>.<secret>` token.
fn key_id(client: &Client) -> String {
    let token = client.token().expect("a token");
    token
        .split('.')
        .nth(1)
        .expect("gpr.<keyId>.<secret>")
        .to_owned()
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
    for audit_only in [
        "reason",
        "actorKeyId",
        "requestId",
        "clientRequestId",
        "hash",
        "prevHash",
    ] {
        assert!(release.get(audit_only).is_none(), "{audit_only}: {release}");
    }
    // A key that reads the audit trail gets the whole event there as in the feed.
    let page = feed(&scene.owner, "").expect_status(200).json();
    let release = items(&page)
        .into_iter()
        .find(|e| e["action"] == "reservation.release")
        .expect("the owner hears of the release");
    assert_eq!(release["reason"], "internal: customer escalation 4711");
    assert!(release["actorKeyId"].is_string() && release["requestId"].is_string());
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
    let head: i64 = cursor_of(&scene.app.operator(), "")
        .parse()
        .expect("a number");
    assert!(stranger_cursor.parse::<i64>().expect("a number") < head);
    scene.capacity("reclaim", &["g1"], "training starts");
    scene.capacity("release", &["g2"], "idle again");
    assert_eq!(cursor_of(&scene.stranger, "?after=0"), stranger_cursor);
    assert_eq!(
        cursor_of(&scene.stranger, &format!("?after={stranger_cursor}&wait=1")),
        stranger_cursor
    );
    // The buyer's cursor moves to its own last event, not to the trail's head.
    let buyer_cursor: i64 = cursor_of(&scene.buyer, "").parse().expect("a number");
    let head: i64 = cursor_of(&scene.app.operator(), "")
        .parse()
        .expect("a number");
    assert!(buyer_cursor < head, "buyer {buyer_cursor}, head {head}");
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
        std::thread::spawn(move || feed(&audience, &format!("?after={cursor}&wait=20")))
    };
    std::thread::sleep(Duration::from_millis(500));
    scene
        .app
        .operator()
        .delete(&format!(
            "/v1/orgs/{AUDIENCE}/keys/{}",
            key_id(&scene.audience)
        ))
        .expect_status(200);
    let started = Instant::now();
    // An event the key would have seen, written after the revocation.
    scene.capacity("release", &["g2"], "after the revocation");
    let answer = waiting.join().expect("the long poll");
    answer.expect_problem(401, "unauthorized");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the poll waited out its whole wait"
    );
}

/// `count` polls `GET /v1/events?wait=` of `client`, each on a connection of its own, sent
/// in waves of 25 a few milliseconds apart: the polls are held together, while the host's
/// pool of instances (shared by the suites that run beside this one) never sees them all
/// arrive in the same instant.
fn spawn_polls(client: &Client, count: usize, wait: u64) -> Vec<std::thread::JoinHandle<Reply>> {
    (0..count)
        .map(|i| {
            if i > 0 && i % 25 == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let client = client.with_timeout(Duration::from_secs(60));
            std::thread::spawn(move || feed(&client, &format!("?after=1000000&wait={wait}")))
        })
        .collect()
}

/// Callers other than a busy key: health, another org's reads, another org's write.
fn others_are_served(scene: &Scene, what: &str) {
    let health = scene.app.anonymous().get("/v1/healthz");
    assert_eq!(health.status, 200, "{what}: healthz: {}", health.text());
    let vms = scene.buyer.get("/v1/vms");
    assert_eq!(
        vms.status,
        200,
        "{what}: another key's read: {}",
        vms.text()
    );
    let page = feed(&scene.owner, "?wait=0");
    assert_eq!(
        page.status,
        200,
        "{what}: another key's feed: {}",
        page.text()
    );
    let write = scene.owner.post(
        &format!(
            "/v1/nodes/{NODE}/reservations/{}/release",
            scene.reservation
        ),
        &json!({ "unitIds": ["g0"] }),
    );
    assert_eq!(write.status, 200, "{what}: a write: {}", write.text());
}

/// On a shared database polls that arrive together may find sqld at its bound on requests
/// in flight, or out of connections, past the app's retries: a clear 503 with Retry-After of
/// the poll's own, which takes no place and is never anyone else's failure.
fn shared_database_unavailable(reply: Reply) {
    assert!(reply.header("retry-after").is_some(), "{}", reply.text());
    let code = reply.json()["code"].as_str().unwrap_or_default().to_owned();
    assert!(
        code == "database-busy" || code == "storage-unavailable",
        "{}",
        reply.text()
    );
    reply.expect_problem(503, &code);
}

#[test]
fn one_key_s_waiting_polls_are_bounded_and_never_crowd_out_other_callers() {
    let _machine = api_support::machine_to_itself();
    let scene = Scene::open();
    // Long enough a wait that all 1 100 are sent while the first are still held, however
    // loaded the machine.
    let polls = spawn_polls(&scene.stranger, 1100, 15);
    // While the key's polls are held, everyone else is served.
    std::thread::sleep(Duration::from_secs(2));
    others_are_served(&scene, "while 1 100 polls of one key are held");
    let mut waited = 0;
    let mut refused = 0;
    let mut unavailable = 0;
    for poll in polls {
        let reply = poll.join().expect("a poll");
        match reply.status {
            200 => waited += 1,
            429 => {
                let retry_after: u64 = reply
                    .header("retry-after")
                    .expect("Retry-After")
                    .parse()
                    .expect("seconds");
                assert!((1..=20).contains(&retry_after), "{retry_after}");
                reply.expect_problem(429, "too-many-waits");
                refused += 1;
            }
            503 if remote_by_default() => {
                shared_database_unavailable(reply);
                unavailable += 1;
            }
            status => panic!("a poll answered {status}: {}", reply.text()),
        }
    }
    assert!(
        (1..=WAITS_PER_KEY).contains(&waited),
        "{waited} polls of one key waited"
    );
    assert_eq!(waited + refused + unavailable, 1100);
    if !remote_by_default() {
        assert_eq!((waited, refused), (WAITS_PER_KEY, 1100 - WAITS_PER_KEY));
    }
    // Their places given back, the key may wait again.
    let again = spawn_polls(&scene.stranger, WAITS_PER_KEY, 1);
    for poll in again {
        poll.join().expect("a poll").expect_status(200);
    }

    // Clients that hang up: their instances run out their wait (as under Spin, which does not
    // stop a guest whose client went away), holding only their own key's places.
    let request = format!(
        "GET /v1/events?after=1000000&wait=4 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        scene.stranger.token().expect("a token")
    );
    let addr = scene.app.base.trim_start_matches("http://").to_owned();
    let hung_up = Instant::now();
    for i in 0..1100 {
        if i > 0 && i % 25 == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream.write_all(request.as_bytes()).expect("send");
        drop(stream);
    }
    std::thread::sleep(Duration::from_millis(500));
    others_are_served(&scene, "after 1 100 polls hung up");
    // Once their waits are over, the key's places are free again.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(hung_up.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = feed(&scene.stranger, "?after=1000000&wait=1");
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 429, "{}", reply.text());
        assert!(
            Instant::now() < deadline,
            "the key's places were never given back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn waiting_polls_over_the_whole_service_are_bounded_with_a_503() {
    let _machine = api_support::machine_to_itself();
    let scene = Scene::open();
    let keys: Vec<Client> = (0..WAITS_OVERALL / WAITS_PER_KEY + 1)
        .map(|_| scene.app.key(STRANGER, "viewer", None))
        .collect();
    let polls: Vec<_> = keys
        .iter()
        .flat_map(|key| spawn_polls(key, WAITS_PER_KEY, 10))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    others_are_served(&scene, "while the service holds all its waits");
    let (mut waited, mut exhausted, mut unavailable) = (0, 0, 0);
    for poll in polls {
        let reply = poll.join().expect("a poll");
        match reply.status {
            200 => waited += 1,
            503 if reply.json()["code"] == "waits-exhausted" => {
                assert!(reply.header("retry-after").is_some(), "{}", reply.text());
                reply.expect_problem(503, "waits-exhausted");
                exhausted += 1;
            }
            503 if remote_by_default() => {
                shared_database_unavailable(reply);
                unavailable += 1;
            }
            status => panic!("a poll answered {status}: {}", reply.text()),
        }
    }
    let sent = WAITS_OVERALL + WAITS_PER_KEY;
    assert_eq!(waited + exhausted + unavailable, sent);
    assert!(waited <= WAITS_OVERALL, "{waited} polls waited at once");
    if unavailable == 0 {
        assert_eq!((waited, exhausted), (WAITS_OVERALL, WAITS_PER_KEY));
    } else {
        assert!(
            waited + unavailable >= WAITS_OVERALL,
            "{waited} waited, {unavailable} unavailable"
        );
    }
}

#[test]
fn a_poll_with_nothing_to_wait_for_takes_no_place() {
    let scene = Scene::open();
    // Events are there already: the answer comes at once, whatever the key's waits.
    let held = spawn_polls(&scene.audience, WAITS_PER_KEY, 3);
    std::thread::sleep(Duration::from_millis(800));
    let page = feed(&scene.audience, "?wait=3").expect_status(200).json();
    assert!(!items(&page).is_empty());
    for poll in held {
        poll.join().expect("a poll").expect_status(200);
    }
    let places: i64 = scene
        .app
        .db()
        .query_row("SELECT COUNT(*) FROM feed_waits", [], |r| r.get(0))
        .expect("count");
    assert_eq!(places, 0, "every place was given back");
}
