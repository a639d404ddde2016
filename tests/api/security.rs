//! Findings of an outside probe, each tried as an attacker would: what one tenant learns of another
//! through the audit trail, secrets shown twice, bodies a stranger makes the server hold,
//! crafted times, narrowed keys, existence oracles, ambiguous headers, and a tampered audit
//! chain. Each test failed on the build before the fix.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use api_support::{
    AUDIT_KEY, App, Client, OPERATOR_TOKEN, ReleaseSpec, ReservationSpec, Scenario,
    rfc3339_from_now, sorted,
};

const NODE: &str = "n1";
const SECRET_REASON: &str = "internal: customer X contract 42";

/// A node of `owner` (g0..g3) reserved for `aud`, managed by `mgr`; g0 and g1 released and
/// bought at spot by `buyer1` and `buyer2`; then reclaimed by the owner.
struct Reclaimed {
    app: App,
    rid: String,
    vm1: String,
    vm2: String,
}

fn reclaimed_world() -> Reclaimed {
    let scene = Scenario::new()
        .orgs(&["owner", "aud", "mgr", "buyer1", "buyer2", "stranger"])
        .node(NODE, "owner", &["g0", "g1", "g2", "g3"])
        .reservation(
            "r",
            ReservationSpec::on(NODE, &["g0", "g1", "g2", "g3"])
                .audience(&["aud"])
                .managers(&["mgr"]),
        )
        .key("owner", "owner", "capacity-manager")
        .release(
            ReleaseSpec::of("r", &["g0", "g1"])
                .by("owner")
                .reason(SECRET_REASON),
        )
        .key("buyer1", "buyer1", "member")
        .vm("buyer1", NODE, &["g0"], "spot")
        .key("buyer2", "buyer2", "member")
        .vm("buyer2", NODE, &["g1"], "spot")
        .open();
    let (vm1, vm2) = (scene.vms()[0].clone(), scene.vms()[1].clone());
    let reclaim = scene
        .client("owner")
        .post(
            &format!("{}/reclaim", scene.reservation_path("r")),
            &json!({ "unitIds": ["g0", "g1"], "reason": SECRET_REASON }),
        )
        .expect_status(200)
        .json();
    assert_eq!(reclaim["terminated"], json!(sorted([&vm1, &vm2])));
    Reclaimed {
        rid: scene.reservation_id("r"),
        app: scene.app,
        vm1,
        vm2,
    }
}

fn audit(client: &Client, query: &str) -> Vec<Value> {
    client
        .get(&format!("/v1/audit?limit=1000{query}"))
        .expect_status(200)
        .json()["items"]
        .as_array()
        .expect("items")
        .clone()
}

fn auditor(app: &App, org: &str) -> Client {
    app.key(org, "admin", None)
}

#[test]
fn a_spot_buyer_learns_only_that_its_own_vm_was_reclaimed() {
    let world = reclaimed_world();
    let app = &world.app;
    let buyer = auditor(app, "buyer1");
    let seen = audit(&buyer, "&action=reservation.reclaim");
    assert_eq!(seen.len(), 1, "{seen:?}");
    let mut event = seen[0].clone();
    for assigned in ["seq", "id", "at"] {
        assert!(event.as_object_mut().unwrap().remove(assigned).is_some());
    }
    assert_eq!(
        event,
        json!({
            "action": "reservation.reclaim", "nodeId": NODE, "orgId": "buyer1",
            "unitIds": ["g0"], "terminated": [world.vm1], "skipped": [], "view": "own-vms",
        })
    );
    // Nothing in the whole trail it sees names the reservation, the owner's reason, the
    // actor, or the other buyer's VM.
    let everything = serde_json::to_string(&audit(&buyer, "")).unwrap();
    for secret in [
        world.rid.as_str(),
        SECRET_REASON,
        world.vm2.as_str(),
        "owner",
        "buyer2",
    ] {
        assert!(!everything.contains(secret), "{secret} leaks: {everything}");
    }
    // Asking by the reservation's id answers exactly as for a reservation that does not exist.
    assert_eq!(
        audit(&buyer, &format!("&reservationId={}", world.rid)),
        audit(&buyer, "&reservationId=r-no-such")
    );
    assert!(audit(&buyer, &format!("&reservationId={}", world.rid)).is_empty());
}

/// The authorization sweep of the audit listing, per party of one reclaim event.
#[test]
fn each_party_of_a_reclaim_sees_what_it_needs_to_know() {
    let world = reclaimed_world();
    let app = &world.app;
    let reclaim_of = |client: &Client| audit(client, "&action=reservation.reclaim");
    for principal in ["owner", "aud", "mgr"] {
        let seen = reclaim_of(&auditor(app, principal));
        assert_eq!(seen.len(), 1, "{principal}");
        assert_eq!(seen[0]["reservationId"], world.rid.as_str(), "{principal}");
        assert_eq!(seen[0]["reason"], SECRET_REASON, "{principal}");
        assert_eq!(
            seen[0]["terminated"],
            json!(sorted([&world.vm1, &world.vm2])),
            "{principal}"
        );
        assert!(seen[0].get("view").is_none(), "{principal}");
        assert!(seen[0].get("visibleTo").is_none(), "{principal}");
    }
    for (buyer, vm, unit) in [("buyer1", &world.vm1, "g0"), ("buyer2", &world.vm2, "g1")] {
        let seen = reclaim_of(&auditor(app, buyer));
        assert_eq!(seen.len(), 1, "{buyer}");
        assert_eq!(seen[0]["view"], "own-vms");
        assert_eq!(seen[0]["terminated"], json!([vm]), "{buyer}");
        assert_eq!(seen[0]["unitIds"], json!([unit]), "{buyer}");
        assert!(seen[0].get("reservationId").is_none(), "{buyer}");
        assert!(seen[0].get("actorKeyId").is_none(), "{buyer}");
    }
    assert!(reclaim_of(&auditor(app, "stranger")).is_empty());
    let operator = reclaim_of(&app.operator());
    assert_eq!(operator[0]["visibleTo"], json!(["aud", "mgr", "owner"]));
    assert_eq!(
        operator[0]["vmOwners"],
        json!([
            { "orgId": "buyer1", "vmIds": [world.vm1], "unitIds": ["g0"] },
            { "orgId": "buyer2", "vmIds": [world.vm2], "unitIds": ["g1"] },
        ])
    );

    // A spot VM stopped directly by a capacity manager: its org sees that much, no more.
    let owner = app.key("owner", "capacity-manager", None);
    let path = format!("/v1/nodes/{NODE}/reservations/{}", world.rid);
    owner
        .post(&format!("{path}/release"), &json!({ "unitIds": ["g2"] }))
        .expect_status(200);
    let vm3 = app
        .key("buyer1", "member", None)
        .post(
            "/v1/vms",
            &json!({ "nodeId": NODE, "unitIds": ["g2"], "tier": "spot" }),
        )
        .created_id();
    app.key("mgr", "capacity-manager", None)
        .delete(&format!("/v1/vms/{vm3}"))
        .expect_status(200);
    let stopped = audit(&auditor(app, "buyer1"), "&action=vm.terminate");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["view"], "own-vms");
    assert_eq!(stopped[0]["vmId"], vm3.as_str());
    assert!(stopped[0].get("actorOrgId").is_none());
    assert_eq!(
        audit(&auditor(app, "mgr"), "&action=vm.terminate")[0]["actorOrgId"],
        "mgr"
    );
}

/// Every file of the app's state (databases, their journals, component logs) as bytes.
fn state_bytes(app: &App) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![app.state_dir().to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("state dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push((
                    path.display().to_string(),
                    std::fs::read(&path).expect("read"),
                ));
            }
        }
    }
    assert!(files.len() >= 2, "the state holds the databases: {files:?}");
    files
}

#[test]
fn a_key_token_is_shown_once_and_never_stored() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator();
    let mut tokens = Vec::new();
    for (path, body) in [
        (
            "/v1/orgs/acme/keys",
            json!({ "name": "ci", "role": "viewer" }),
        ),
        ("/v1/operator/keys", json!({ "name": "automation" })),
    ] {
        let idempotent = operator.with_header("idempotency-key", &format!("mint-once{path}"));
        let first = idempotent.post(path, &body).expect_status(201).json();
        let token = first["token"].as_str().expect("token").to_owned();
        assert!(first.get("tokenWithheld").is_none());
        let replay = idempotent.post(path, &body);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        let replay = replay.expect_status(201).json();
        assert_eq!(replay["id"], first["id"]);
        assert!(replay.get("token").is_none(), "{replay}");
        assert_eq!(replay["tokenWithheld"], true);
        operator
            .delete(&format!("{path}/{}", first["id"].as_str().unwrap()))
            .expect_status(200);
        let after_revocation = idempotent.post(path, &body).expect_status(201).json();
        assert!(after_revocation.get("token").is_none());
        tokens.push(token);
    }
    for (file, bytes) in state_bytes(&app) {
        for token in &tokens {
            let secret = token.rsplit('.').next().unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{file} holds a token's secret"
            );
        }
    }
}

/// One exchange on a raw connection: `head` (ending in an empty line), then `body` only if
/// the server answers `100 Continue`. Returns whether it did, and the final answer.
fn exchange(app: &App, head: &str, body: &[u8]) -> (bool, String) {
    let address = app.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(head.as_bytes()).expect("head");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 65536];
    let mut continued = false;
    loop {
        let n = stream.read(&mut buffer).unwrap_or(0);
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if !continued && text.starts_with("HTTP/1.1 100") && text.contains("\r\n\r\n") {
            continued = true;
            answer.clear();
            let _ = stream.write_all(body);
        }
    }
    (continued, String::from_utf8_lossy(&answer).into_owned())
}

fn status_and_code(answer: &str) -> (u16, Option<String>) {
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {answer:?}"));
    let code = answer
        .split("\"code\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned);
    (status, code)
}

/// A request framed both by `Transfer-Encoding` and by `Content-Length` is read as chunked
/// (RFC 9112 §6.3) and the connection closed after its answer (§6.1), so a request hidden
/// after its chunked body is never served: where a proxy framed the body by its length, that
/// would be a smuggled request. The control, the same bytes framed by `Transfer-Encoding`
/// alone, serves the hidden request too: what the first answer stops is the framing's doing.
#[test]
fn a_request_framed_two_ways_is_answered_once_and_nothing_after_it_is_served() {
    let app = App::start();
    let hidden = "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let body = r#"{"name": "Framed twice"}"#;
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n{hidden}", body.len());
    let head = |framing: &str| {
        format!(
            "POST /v1/orgs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n{framing}\r\n{chunked}"
        )
    };
    let answers = |answer: &str| -> Vec<String> {
        answer
            .split("HTTP/1.1 ")
            .skip(1)
            .map(|a| a.get(..3).unwrap_or_default().to_owned())
            .collect()
    };
    // The control: framed by its chunks alone, the org is made and the hidden request served.
    let (_, control) = exchange(&app, &head(""), b"");
    assert_eq!(answers(&control), ["201", "200"], "{control}");
    assert!(control.contains("\"openapi\""), "{control}");
    // Framed both ways: the org's request alone is answered, then the connection is closed.
    let (_, answer) = exchange(
        &app,
        &head(&format!("Content-Length: {}\r\n", chunked.len())),
        b"",
    );
    assert_eq!(
        answers(&answer).len(),
        1,
        "one answer, then the connection closed: {answer}"
    );
    assert!(
        !answer.contains("\"openapi\""),
        "the hidden request was served: {answer}"
    );
}

#[test]
fn a_body_is_read_only_after_authentication_within_its_limit() {
    let app = App::start();
    app.org("acme");
    let member = app.key("acme", "member", None);
    let token = member.token().expect("token").to_owned();
    let post = |authorization: &str, framing: &str| {
        format!(
            "POST /v1/vms HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             expect: 100-continue\r\nconnection: close\r\n{authorization}{framing}\r\n"
        )
    };
    // A stranger declaring 200 MB: refused at once, nothing asked for.
    let (continued, answer) = exchange(&app, &post("", "content-length: 200000000\r\n"), b"");
    assert!(!continued);
    assert_eq!(
        status_and_code(&answer),
        (413, Some("payload-too-large".into()))
    );
    // A stranger with a body of any framing: 401 before a byte of it is asked for.
    for framing in ["transfer-encoding: chunked\r\n", "content-length: 100\r\n"] {
        let (continued, answer) = exchange(&app, &post("", framing), b"");
        assert!(!continued, "{framing}");
        assert_eq!(
            status_and_code(&answer),
            (401, Some("unauthorized".into())),
            "{framing}"
        );
    }
    // A known caller's chunked body is read only up to the route's limit.
    let chunk = vec![b' '; 200 * 1024];
    let body = [
        format!("{:x}\r\n", chunk.len()).as_bytes(),
        &chunk,
        b"\r\n0\r\n\r\n",
    ]
    .concat();
    let bearer = format!("authorization: Bearer {token}\r\n");
    let (continued, answer) = exchange(
        &app,
        &post(&bearer, "transfer-encoding: chunked\r\n"),
        &body,
    );
    assert!(continued);
    assert_eq!(
        status_and_code(&answer),
        (413, Some("payload-too-large".into()))
    );
}

#[test]
fn a_body_that_does_not_arrive_ends_the_request() {
    let app = App::start_with(|config| config.env("SPIN_VARIABLE_BODY_DEADLINE_MS", "300"));
    app.org("acme");
    let token = app.key("acme", "member", None).token().unwrap().to_owned();
    let address = app.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /v1/vms HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"nodeId\""
    );
    stream.write_all(head.as_bytes()).unwrap();
    // The rest never comes; the server answers without it.
    let mut answer = vec![0u8; 4096];
    let n = stream
        .read(&mut answer)
        .expect("an answer before the client gives up");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert_eq!(
        status_and_code(&answer),
        (408, Some("request-timeout".into()))
    );
}

#[test]
fn crafted_times_are_validated_at_the_stored_precision() {
    let app = App::start();
    app.org("owner");
    app.node(NODE, "owner", &["g0"]);
    let problem = app
        .operator()
        .post(
            &format!("/v1/nodes/{NODE}/reservations"),
            &json!({
                "reservedUnitIds": ["g0"], "allowedOrgIds": [], "managingOrgIds": [],
                "startsAt": "2030-01-01T00:00:00.0001Z", "endsAt": "2030-01-01T00:00:00.0009Z",
            }),
        )
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "endsAt");
}

#[test]
fn refusals_say_nothing_of_what_the_caller_may_not_see() {
    let app = App::start();
    for org in ["owner", "aud", "hidden", "stranger"] {
        app.org(org);
    }
    app.node(NODE, "owner", &["g0", "g1"]);
    app.reservation(NODE, &["g0"], &["aud"], &[]);
    // The owner cannot tell an org it may not see from one that does not exist: a request
    // that fails anyway fails the same way for both.
    let owner = app.key("owner", "admin", None);
    let overlapping = |org: &str| {
        owner
            .post(
                &format!("/v1/nodes/{NODE}/reservations"),
                &json!({
                    "reservedUnitIds": ["g0"], "allowedOrgIds": [org],
                    "startsAt": rfc3339_from_now(-60),
                }),
            )
            .expect_problem(409, "reservation-overlap")
    };
    let hidden = overlapping("hidden");
    let ghost = overlapping("ghost");
    assert_eq!(hidden["unitIds"], ghost["unitIds"]);
    // An outsider is told a reserved unit is not available to it, not who holds it or why.
    let problem = app
        .key("stranger", "member", None)
        .post(
            "/v1/vms",
            &json!({ "nodeId": NODE, "unitIds": ["g0"], "tier": "spot" }),
        )
        .expect_problem(409, "placement-refused");
    assert_eq!(
        problem["refusals"],
        json!([{ "unitId": "g0", "reason": "unavailable" }])
    );
}

#[test]
fn ambiguous_headers_are_refused() {
    let app = App::start();
    let raw = |headers: &str, body: &str| {
        let head = format!(
            "POST /v1/orgs HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{headers}\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let address = app.base.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).expect("connect");
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        status_and_code(&answer)
    };
    let bearer = format!("authorization: Bearer {OPERATOR_TOKEN}\r\n");
    let json_type = "content-type: application/json\r\n";
    let body = r#"{"name":"Acme"}"#;
    for (what, headers) in [
        (
            "two Authorization headers",
            format!("{bearer}authorization: Bearer other\r\n{json_type}"),
        ),
        (
            "two Idempotency-Key headers",
            format!("{bearer}idempotency-key: a\r\nidempotency-key: b\r\n{json_type}"),
        ),
        (
            "two Content-Type headers",
            format!("{bearer}{json_type}content-type: text/plain\r\n"),
        ),
    ] {
        assert_eq!(
            raw(&headers, body),
            (400, Some("repeated-header".into())),
            "{what}"
        );
    }
    for charset in ["utf-16", "latin1", "\"utf-16le\""] {
        assert_eq!(
            raw(
                &format!("{bearer}content-type: application/json; charset={charset}\r\n"),
                body
            ),
            (415, Some("unsupported-media-type".into())),
            "{charset}"
        );
    }
    assert_eq!(
        raw(
            &format!("{bearer}content-type: application/json; charset=\"UTF-8\"\r\n"),
            body
        )
        .0,
        201
    );
}

/// HMAC-SHA-256, written out from RFC 2104, as an independent check of the chain's keying.
fn hmac_sha256(key: &[u8], message: &[u8]) -> String {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::digest([pad(0x36).as_slice(), message].concat());
    hex::encode(Sha256::digest([pad(0x5c).as_slice(), &inner].concat()))
}

/// The documented hash input of a version-2 event, from the operator's view of it.
fn hash_input(event: &Value) -> Vec<u8> {
    let at = chrono::DateTime::parse_from_rfc3339(event["at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    let field = |name: &str| event.get(name).cloned().unwrap_or(Value::Null);
    let millis = |value: &Value| {
        chrono::DateTime::parse_from_rfc3339(value.as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    let deadlines: serde_json::Map<String, Value> = event
        .get("deadlines")
        .and_then(Value::as_object)
        .map(|d| {
            d.iter()
                .map(|(vm, at)| (vm.clone(), json!(millis(at))))
                .collect()
        })
        .unwrap_or_default();
    let content = json!([
        event["chain"],
        event["afterSeq"],
        event["id"],
        at,
        field("actorKeyId"),
        field("actorOrgId"),
        field("action"),
        field("nodeId"),
        field("reservationId"),
        field("vmId"),
        field("orgId"),
        field("subjectId"),
        field("unitIds"),
        field("terminated"),
        field("skipped"),
        field("reason"),
        field("requestId"),
        field("clientRequestId"),
        field("visibleTo"),
        field("vmOwners"),
        deadlines,
        event
            .get("releaseUntil")
            .map_or(Value::Null, |t| json!(millis(t))),
    ]);
    content.to_string().into_bytes()
}

#[test]
fn the_audit_chain_is_keyed_pinnable_and_never_a_500() {
    let world = reclaimed_world();
    let app = &world.app;
    let operator = app.operator();
    let events = audit(&operator, "");
    // Anyone holding the key recomputes every hash from what the operator is shown.
    // And every seal, each from the one before it in its chain.
    let mut links: std::collections::BTreeMap<String, String> = Default::default();
    for event in &events {
        assert_eq!(event["hashVersion"], 5);
        assert_eq!(
            event["hash"].as_str().unwrap(),
            hmac_sha256(AUDIT_KEY.as_bytes(), &hash_input(event)),
            "{event}"
        );
        let chain = event["chain"].as_str().unwrap().to_owned();
        let before = links.get(&chain).cloned().unwrap_or_else(|| "0".repeat(64));
        if let Some(seal) = event.get("seal") {
            let input = format!(
                "seal\n{before}\n{}\n{}",
                event["chainSeq"],
                event["hash"].as_str().unwrap()
            );
            assert_eq!(
                seal.as_str().unwrap(),
                hmac_sha256(AUDIT_KEY.as_bytes(), input.as_bytes()),
                "{event}"
            );
            links.insert(chain, seal.as_str().unwrap().to_owned());
        }
    }
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(verified["ok"], true);
    let node_chain = verified["chains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["chain"] == "node:n1")
        .unwrap()
        .clone();
    let (pin_seq, pin_hash) = (
        node_chain["lastSeq"].clone(),
        node_chain["lastHash"].clone(),
    );
    // The newest sealed event: the newest of all waits for the next write to seal it.
    assert_eq!(
        pin_seq,
        events.iter().filter(|e| e["chain"] == "node:n1").count() - 1
    );

    // Rewriting an event and recomputing a plain SHA-256 does not pass: the key is needed.
    let release = events
        .iter()
        .find(|e| e["action"] == "reservation.release")
        .unwrap();
    let mut rewritten = release.clone();
    rewritten["reason"] = json!("routine");
    let seq = rewritten["seq"].as_i64().unwrap();
    let place = rewritten["chainSeq"].as_i64().unwrap();
    let rewrite = |hash: &str| {
        app.node_db(NODE)
            .execute(
                "UPDATE audit_events SET reason = 'routine', hash = ?1 WHERE seq = ?2",
                rusqlite::params![hash, seq],
            )
            .unwrap();
    };
    rewrite(&hex::encode(Sha256::digest(hash_input(&rewritten))));
    let broken = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(
        (broken["ok"].clone(), broken["firstBrokenSeq"].clone()),
        (json!(false), json!(place))
    );
    // With the key the event's own hash passes, but its seal, written by a later write, was
    // of the old hash: the rewrite also needs every later seal (the key is a secret).
    rewrite(&hmac_sha256(AUDIT_KEY.as_bytes(), &hash_input(&rewritten)));
    let seal_of_old_hash = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(seal_of_old_hash["firstBrokenSeq"], place);
    assert!(
        seal_of_old_hash["problem"]
            .as_str()
            .unwrap()
            .contains("seal does not follow"),
        "{seal_of_old_hash}"
    );
    rewrite(release["hash"].as_str().unwrap());
    app.node_db(NODE)
        .execute(
            "UPDATE audit_events SET reason = ?1 WHERE seq = ?2",
            rusqlite::params![SECRET_REASON, seq],
        )
        .unwrap();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );

    // Deleting a chain's newest events leaves a shorter chain that links; the pin finds it,
    // given as pin=<chain>:<seq>:<hash> or as seq and hash of the node's chain.
    let pins = [
        format!(
            "/v1/audit/verify?pin=node:n1:{pin_seq}:{}",
            pin_hash.as_str().unwrap()
        ),
        format!(
            "/v1/audit/verify?nodeId=n1&seq={pin_seq}&hash={}",
            pin_hash.as_str().unwrap()
        ),
    ];
    for pinned in &pins {
        assert_eq!(operator.get(pinned).expect_status(200).json()["ok"], true);
    }
    app.node_db(NODE)
        .execute(
            "DELETE FROM audit_events WHERE chain = 'node:n1' AND chain_seq >= \
             (SELECT max(chain_seq) - 1 FROM audit_events WHERE chain = 'node:n1')",
            [],
        )
        .unwrap();
    assert_eq!(
        operator.get("/v1/audit/verify").expect_status(200).json()["ok"],
        true
    );
    for pinned in &pins {
        let truncated = operator.get(pinned).expect_status(200).json();
        assert_eq!(truncated["ok"], false, "{truncated}");
        assert_eq!(truncated["brokenChain"], "node:n1");
    }
    operator
        .get("/v1/audit/verify?seq=1")
        .expect_problem(400, "invalid-parameter");
    operator
        .get("/v1/audit/verify?seq=1&hash=ab")
        .expect_problem(400, "invalid-parameter");
    operator
        .get("/v1/audit/verify?pin=nocolons")
        .expect_problem(400, "invalid-parameter");

    // A malformed row is reported, never a 500.
    app.node_db(NODE)
        .execute("UPDATE audit_events SET at = 'yesterday' WHERE seq = 3", [])
        .unwrap();
    let damaged = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(damaged["ok"], false, "{damaged}");
    assert!(
        damaged["problem"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{damaged}"
    );
    let listed = audit(&operator, "");
    let unreadable: Vec<&Value> = listed
        .iter()
        .filter(|row| row["unreadable"] == true)
        .collect();
    assert_eq!(unreadable.len(), 1, "{listed:?}");
    assert_eq!(unreadable[0]["seq"], 3);
    audit(&auditor(app, "buyer1"), "");
}

/// A refusal as a client compares them: status, code, detail and the parameter named.
fn refusal_of(reply: api_support::Reply) -> (u16, Value, Value, Value) {
    let body = reply.json();
    (
        reply.status,
        body["code"].clone(),
        body["detail"].clone(),
        body["parameter"].clone(),
    )
}

/// Every page of `path` (`?limit=1` and each `nextCursor` in turn): the ids listed.
fn paged_ids(client: &Client, path: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            None => "?limit=1".to_owned(),
            Some(cursor) => format!("?limit=1&cursor={cursor}"),
        };
        let page = client
            .get(&format!("{path}{query}"))
            .expect_status(200)
            .json();
        for item in page["items"].as_array().expect("items") {
            ids.push(item["id"].as_str().expect("id").to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
}

#[test]
fn a_cursor_tells_nothing_of_what_lies_outside_the_caller_s_listing() {
    let scene = Scenario::new()
        .orgs(&["owner", "other"])
        .node(NODE, "owner", &["g0", "g1", "g2"])
        .node("n2", "other", &["h0"])
        .reservation("r0", ReservationSpec::on(NODE, &["g0"]))
        .reservation("r1", ReservationSpec::on(NODE, &["g1"]))
        .reservation("r2", ReservationSpec::on(NODE, &["g2"]))
        .reservation("theirs", ReservationSpec::on("n2", &["h0"]))
        .key("owner", "owner", "admin")
        .key("owner-viewer", "owner", "viewer")
        .key("other", "other", "admin")
        .open();
    let owner = scene.client("owner");
    let other = scene.client("other");
    let operator = scene.app.operator();
    let mine = format!("/v1/nodes/{NODE}/reservations");
    let theirs = "/v1/nodes/n2/reservations";

    // Paging still walks the whole listing, each item once.
    let ids = paged_ids(&owner, &mine);
    let mut expected: Vec<String> = ["r0", "r1", "r2"]
        .iter()
        .map(|r| scene.reservation_id(r))
        .collect();
    expected.sort();
    let mut listed = ids.clone();
    listed.sort();
    assert_eq!(listed, expected, "{ids:?}");

    // Another org's reservation, an id that names nothing, junk, and a cursor of another
    // listing (the other org's own node, and the same node as another caller lists it): one
    // and the same refusal.
    let their_cursor = other
        .get(&format!("{theirs}?limit=1"))
        .expect_status(200)
        .json()["nextCursor"]
        .as_str()
        .map(str::to_owned);
    let operator_cursor = operator
        .get(&format!("{mine}?limit=1"))
        .expect_status(200)
        .json()["nextCursor"]
        .as_str()
        .expect("the operator's next page")
        .to_owned();
    let refusal = refusal_of(owner.get(&format!("{mine}?cursor=res-no-such-reservation")));
    assert_eq!(refusal.0, 400, "{refusal:?}");
    assert_eq!(refusal.1, "invalid-parameter", "{refusal:?}");
    assert_eq!(refusal.3, "cursor", "{refusal:?}");
    let mut foreign = vec![
        scene.reservation_id("theirs"),
        "zz".to_owned(),
        operator_cursor.clone(),
    ];
    foreign.extend(their_cursor);
    for cursor in &foreign {
        assert_eq!(
            refusal_of(owner.get(&format!("{mine}?cursor={cursor}"))),
            refusal,
            "cursor {cursor}"
        );
    }

    // Keys: another org's key id, an unknown one, and the operators' listing's cursor.
    let their_key = api_support::key_id(&other);
    let refusal = refusal_of(owner.get("/v1/orgs/owner/keys?cursor=key-no-such-key"));
    assert_eq!(refusal.0, 400, "{refusal:?}");
    let key_ids = paged_ids(&owner, "/v1/orgs/owner/keys");
    assert_eq!(key_ids.len(), 2, "{key_ids:?}");
    operator
        .post("/v1/operator/keys", &json!({ "name": "spare" }))
        .expect_status(201);
    operator
        .post("/v1/operator/keys", &json!({ "name": "spare 2" }))
        .expect_status(201);
    let operator_keys_cursor = operator
        .get("/v1/operator/keys?limit=1")
        .expect_status(200)
        .json()["nextCursor"]
        .as_str()
        .expect("a next page of operator keys")
        .to_owned();
    let their_keys_cursor = operator
        .get("/v1/orgs/other/keys?limit=1")
        .expect_status(200)
        .json()["nextCursor"]
        .as_str()
        .map(str::to_owned);
    let mut foreign = vec![their_key.clone(), operator_keys_cursor.clone()];
    foreign.extend(their_keys_cursor);
    for cursor in &foreign {
        assert_eq!(
            refusal_of(owner.get(&format!("/v1/orgs/owner/keys?cursor={cursor}"))),
            refusal,
            "cursor {cursor}"
        );
    }
    // Operator keys: an org key's id is no cursor of theirs either.
    assert_eq!(
        refusal_of(operator.get(&format!("/v1/operator/keys?cursor={their_key}"))),
        refusal_of(operator.get("/v1/operator/keys?cursor=key-no-such-key")),
    );
    operator
        .get(&format!("/v1/operator/keys?cursor={operator_keys_cursor}"))
        .expect_status(200);
}

/// A cursor in the form the server hands out (hex of its listing, position and id), holding
/// `created_at` as given: the text a forger would make.
fn forged_cursor(listing: &str, created_at: &str, id: &str) -> String {
    format!("{listing}\n{created_at}\nt{id}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn forged_cursors_are_refused_like_any_other_on_every_store() {
    let scene = Scenario::new()
        .orgs(&["owner"])
        .node(NODE, "owner", &["g0", "g1"])
        .reservation("r0", ReservationSpec::on(NODE, &["g0"]))
        .reservation("r1", ReservationSpec::on(NODE, &["g1"]))
        .key("owner", "owner", "admin")
        .open();
    let owner = scene.client("owner");
    let operator = scene.app.operator();
    operator
        .post("/v1/operator/keys", &json!({ "name": "spare" }))
        .expect_status(201);
    let listings = [
        (
            &owner,
            format!("/v1/nodes/{NODE}/reservations"),
            format!("reservations {NODE} owner"),
        ),
        (
            &owner,
            "/v1/orgs/owner/keys".to_owned(),
            "keys owner owner".to_owned(),
        ),
        (
            &operator,
            "/v1/operator/keys".to_owned(),
            "operator-keys".to_owned(),
        ),
    ];
    for (client, path, listing) in &listings {
        let garbage = refusal_of(client.get(&format!("{path}?cursor=zz")));
        assert_eq!(garbage.0, 400, "{path}: {garbage:?}");
        // A position no row can hold: SQLite keeps no NaN, and libSQL's wire format carries
        // no infinity, so these never reach the database.
        for number in ["rNaN", "rnan", "rinf", "r-inf", "rinfinity", "r1e999"] {
            let cursor = forged_cursor(listing, number, "x");
            assert_eq!(
                refusal_of(client.get(&format!("{path}?cursor={cursor}"))),
                garbage,
                "{path} at {number}"
            );
        }
        // A forged position that is a real point in the order only resumes the listing there.
        for position in ["r1.5", "i0", "i-9223372036854775808", "n", "x00ff", "tz"] {
            let cursor = forged_cursor(listing, position, "x");
            client
                .get(&format!("{path}?cursor={cursor}"))
                .expect_status(200);
        }
    }
}

#[test]
fn a_stranger_learns_nothing_from_a_bookmark_and_asks_the_database_nothing_more() {
    let scene = Scenario::new()
        .orgs(&["owner"])
        .key("owner", "owner", "admin")
        .key("gone", "owner", "viewer")
        .open();
    let operator = scene.app.operator();
    let written = operator
        .post("/v1/orgs", &json!({ "name": "Written for a bookmark" }))
        .expect_status(201);
    let current = written.header("bookmark").expect("a bookmark").to_owned();
    let gone = scene.client("gone");
    operator
        .delete(&format!(
            "/v1/orgs/owner/keys/{}",
            api_support::key_id(&gone)
        ))
        .expect_status(200);
    let strangers = [
        format!("gpr.key-0123456789abcdef.{}", "ab".repeat(32)),
        format!("gpr.opk-0123456789abcdef.{}", "cd".repeat(32)),
        "gpr.operator.made-up".to_owned(),
        gone.token().expect("a token").to_owned(),
    ];
    // Sent as they are (a client of the app would add the bookmark it holds).
    let whoami = |token: &str, bookmark: Option<&str>| {
        let authorization = format!("Bearer {token}");
        let mut headers = vec![("authorization", authorization.as_str())];
        headers.extend(bookmark.map(|bookmark| ("bookmark", bookmark)));
        let before = scene.app.sqlite_statements();
        let answer = refusal_of(api_support::http::get_with(
            &format!("{}/v1/whoami", scene.app.base),
            &headers,
        ));
        (answer, (scene.app.sqlite_statements() - before).statements)
    };
    // At a replica a request with a bookmark looks for its key again while the copy may be
    // catching up, so its cost is counted only where nothing lags.
    let at_a_replica = scene.app.sites().is_some();
    for stranger in &strangers {
        let (plain, plain_cost) = whoami(stranger, None);
        assert_eq!(plain.0, 401, "{plain:?}");
        let far_ahead = api_support::positions::ahead_of(&current, 1 << 40);
        for bookmark in ["p0", current.as_str(), far_ahead.as_str()] {
            let (answer, cost) = whoami(stranger, Some(bookmark));
            assert_eq!(answer, plain, "bookmark {bookmark}");
            if !at_a_replica {
                assert_eq!(cost, plain_cost, "statements with bookmark {bookmark}");
            }
        }
    }
}

#[test]
fn the_node_vm_and_market_listings_resume_only_from_their_own_cursors() {
    let scene = Scenario::new()
        .orgs(&["owner", "aud", "buyer"])
        .node(NODE, "owner", &["g0", "g1", "g2", "g3"])
        .node("n2", "owner", &["g0", "g1"])
        .key("owner", "owner", "admin")
        .key("buyer", "buyer", "member")
        .key("audience", "aud", "member")
        .reservation(
            "r",
            ReservationSpec::on(NODE, &["g0", "g1", "g2", "g3"]).audience(&["aud"]),
        )
        .reservation(
            "r2",
            ReservationSpec::on("n2", &["g0", "g1"]).audience(&["aud"]),
        )
        .release(ReleaseSpec::of("r", &["g1", "g2", "g3"]))
        .release(ReleaseSpec::of("r2", &["g0", "g1"]))
        .vm("audience", NODE, &["g0"], "community")
        .vm("buyer", NODE, &["g1"], "spot")
        .vm("buyer", NODE, &["g2"], "spot")
        .open();
    let owner = scene.client("owner");
    let buyer = scene.client("buyer");
    let operator = scene.app.operator();
    let next = |client: &Client, path: &str| -> String {
        client
            .get(&format!("{path}?limit=1"))
            .expect_status(200)
            .json()["nextCursor"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: a next page"))
            .to_owned()
    };
    let listings = ["/v1/nodes", "/v1/vms", "/v1/market"];
    let own: Vec<String> = listings.iter().map(|path| next(&buyer, path)).collect();
    let operators: Vec<String> = listings.iter().map(|path| next(&operator, path)).collect();
    let audit_cursor = next(&owner, "/v1/audit");
    let a_vm = scene.fixtures.vms()[1].clone();
    for (i, path) in listings.iter().enumerate() {
        // Its own cursor resumes it.
        buyer
            .get(&format!("{path}?limit=1&cursor={}", own[i]))
            .expect_status(200);
        let refusal = refusal_of(buyer.get(&format!("{path}?cursor=zzz-not-a-cursor")));
        assert_eq!(
            (refusal.0, refusal.1.as_str(), refusal.3.as_str()),
            (400, Some("invalid-parameter"), Some("cursor")),
            "{path}: {refusal:?}"
        );
        // An id, another listing's cursor, the audit trail's, the same listing's as another
        // caller lists it: refused alike.
        let mut foreign = vec![
            NODE.to_owned(),
            a_vm.clone(),
            format!("{NODE}/g1"),
            audit_cursor.clone(),
            operators[i].clone(),
        ];
        foreign.extend(
            own.iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, cursor)| cursor.clone()),
        );
        for cursor in &foreign {
            assert_eq!(
                refusal_of(buyer.get(&format!("{path}?cursor={cursor}"))),
                refusal,
                "{path} with cursor {cursor}"
            );
        }
    }
}

#[test]
fn a_bookmark_is_one_the_api_sealed_so_no_caller_counts_others_writes_with_it() {
    let scene = Scenario::new()
        .orgs(&["owner", "quiet"])
        .key("owner", "owner", "admin")
        .key("viewer", "quiet", "viewer")
        .open();
    let owner = scene.client("owner");
    let viewer = scene.client("viewer");
    let given = owner
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "for a bookmark", "role": "viewer" }),
        )
        .expect_status(201)
        .header("bookmark")
        .expect("a write answers a bookmark")
        .to_owned();
    // The owner's own bookmark is served, to it and to any key of a session it shares.
    for client in [&owner, &viewer] {
        client
            .with_header("bookmark", &given)
            .get("/v1/whoami")
            .expect_status(200);
    }
    // Others write; a viewer that probes positions around theirs learns nothing: every
    // bookmark it makes is refused alike, whatever it holds.
    for n in 0..5 {
        owner
            .post(
                "/v1/orgs/owner/keys",
                &json!({ "name": format!("k{n}"), "role": "viewer" }),
            )
            .expect_status(201);
    }
    let position = api_support::positions::of_bookmark(&given);
    let made_up = |by: i64| api_support::positions::ahead_of(&given, by);
    let mut refusals = Vec::new();
    for bookmark in [
        made_up(-1),
        made_up(1),
        made_up(5),
        made_up(6),
        made_up(1 << 40),
        position.clone(),
        format!("{position}.0"),
    ] {
        refusals.push((
            bookmark.clone(),
            refusal_of(viewer.with_header("bookmark", &bookmark).get("/v1/whoami")),
        ));
    }
    for (bookmark, refusal) in &refusals {
        assert_eq!(refusal, &refusals[0].1, "bookmark {bookmark}");
    }
    assert_eq!(refusals[0].1.0, 400);
    assert_eq!(refusals[0].1.1, "invalid-bookmark");

    // A write sent with a made-up bookmark is refused before it is carried out, and answers
    // nothing the API did not seal.
    let key_count = || {
        owner
            .get("/v1/orgs/owner/keys?limit=100")
            .expect_status(200)
            .json()["items"]
            .as_array()
            .expect("keys")
            .len()
    };
    let keys_before = key_count();
    owner
        .with_header("bookmark", &made_up(99_999_999))
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "forged", "role": "viewer" }),
        )
        .expect_problem(400, "invalid-bookmark");
    let keys_after = key_count();
    assert_eq!(keys_after, keys_before, "the refused write wrote nothing");
    // With its own bookmark, the write's answer is one every read accepts.
    let answered = owner
        .with_header("bookmark", &given)
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "sealed", "role": "viewer" }),
        )
        .expect_status(201)
        .header("bookmark")
        .expect("a bookmark")
        .to_owned();
    for path in ["/v1/whoami", "/v1/nodes", "/v1/audit?limit=1"] {
        owner
            .with_header("bookmark", &answered)
            .get(path)
            .expect_status(200);
    }
}
