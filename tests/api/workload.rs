//! A seeded, randomized, concurrent workload against the running app, and the checks that
//! prove from the database that it kept every promise of docs/design.md. Shared by `concurrency`
//! (one host) and `replicas` (two hosts serving one state directory).
//!
//! Many client threads release, reclaim, dry-run, place VMs of every tier as audience and
//! outsider orgs, terminate VMs, change node topologies, re-affirm reservations, try capacity
//! operations without the permission, and replay earlier requests with their
//! `Idempotency-Key`. Every request carries its own `X-Request-Id`, which the audit trail
//! records, so each 2xx mutation can be matched with exactly one audit event. The checks then
//! replay the audit trail in commit order through a model of the rules and compare the model,
//! every response and the database with each other.
//!
//! The model decides every answer, refusals included: a 2xx mutation must be what the model
//! allows in the state just before its audit event; any other answer (a refusal, a dry run)
//! must be exactly (status, code and the offending ids) what the model answers in one of the
//! states the request may have seen. Those are bounded by a logical clock that every send and
//! every answer ticks: the request saw at least every commit answered before it was sent, and
//! no commit of a request sent after it was answered. And a run where too few mutations
//! succeed fails: a server that refused everything would otherwise pass.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use api_support::scenario::Fixtures;
use api_support::{App, Client, OPERATOR_TOKEN, ReservationSpec, Scenario, asks_for_retry};

// ------------------------------------------------------------------------- randomness

/// SplitMix64: small, seedable, good enough to choose operations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// Between `min` and `max` distinct items, in their original order.
    pub fn subset(&mut self, items: &[&str], min: usize, max: usize) -> Vec<String> {
        let wanted = min + self.below(max - min + 1);
        let mut chosen = BTreeSet::new();
        while chosen.len() < wanted.min(items.len()) {
            chosen.insert(self.below(items.len()));
        }
        chosen.into_iter().map(|i| items[i].to_owned()).collect()
    }
}

/// The seed from `var` if set (to replay a failure), else a fresh one; printed either way.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    println!("seed {seed} (rerun with {var}={seed})");
    seed
}

/// A count from the environment variable `var` (soak runs raise the CI defaults), else
/// `default`; printed when set.
pub fn scale(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(value) => {
            let n = value
                .parse()
                .unwrap_or_else(|_| panic!("{var}={value} is not a count"));
            println!("{var}={n}");
            n
        }
        Err(_) => default,
    }
}

// ------------------------------------------------------------------------- the market

pub const NODES: [&str; 3] = ["n0", "n1", "n2"];
pub const NODE_UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];
/// The reserved units of each node's reservation; g6 and g7 stay unreserved.
pub const RESERVED_UNITS: [&str; 6] = ["g0", "g1", "g2", "g3", "g4", "g5"];
/// Added to and removed from nodes to change their topology.
pub const EXTRA_UNIT: &str = "x0";
pub const AUDIENCE: [&str; 2] = ["tenant-a", "tenant-b"];
pub const OUTSIDERS: [&str; 2] = ["outsider-a", "outsider-b"];
const TIERS: [&str; 3] = ["spot", "community", "verified"];

/// Who sends a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Actor {
    Operator,
    /// A capacity-manager key of the nodes' owner org.
    Owner,
    /// A capacity-manager key of the reservations' managing org.
    Broker,
    /// A viewer key of the managing org: no `reservation.capacity`.
    BrokerViewer,
    /// A member key of an audience or outsider org.
    Member(String),
}

/// Orgs, keys, three nodes and one active reservation on each, made through the API.
pub struct Market {
    fixtures: Fixtures,
    /// (node, reservation id)
    pub reservations: Vec<(String, String)>,
}

impl Market {
    pub fn setup(app: &App) -> Market {
        let mut scenario = Scenario::new()
            .orgs(&["owner", "broker"])
            .orgs(&AUDIENCE)
            .orgs(&OUTSIDERS)
            .key("owner", "owner", "capacity-manager")
            .key("broker", "broker", "capacity-manager")
            .key("broker-viewer", "broker", "viewer");
        for org in AUDIENCE.into_iter().chain(OUTSIDERS) {
            scenario = scenario.key(org, org, "member");
        }
        for node in NODES {
            scenario = scenario.node(node, "owner", &NODE_UNITS).reservation(
                node,
                ReservationSpec::on(node, &RESERVED_UNITS)
                    .audience(&AUDIENCE)
                    .managers(&["broker"]),
            );
        }
        let fixtures = scenario.make_in(app);
        let reservations = fixtures
            .reservations()
            .map(|r| (r.node.clone(), r.id.clone()))
            .collect();
        Market {
            fixtures,
            reservations,
        }
    }

    pub fn token(&self, actor: &Actor) -> String {
        match actor {
            Actor::Operator => OPERATOR_TOKEN.to_owned(),
            Actor::Owner => self.fixtures.token("owner"),
            Actor::Broker => self.fixtures.token("broker"),
            Actor::BrokerViewer => self.fixtures.token("broker-viewer"),
            Actor::Member(org) => self.fixtures.token(org),
        }
    }
}

// ------------------------------------------------------------------------- operations

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Release,
    Reclaim,
    DryRun,
    /// A release by a key without `reservation.capacity`: always 404.
    CapacityWithoutPermission,
    Place,
    Terminate,
    PutNode,
    Reaffirm,
    /// An earlier POST sent again with its `Idempotency-Key`.
    Replay,
    /// A release, reclaim or placement sent twice at the same time with one
    /// `Idempotency-Key` (to two hosts, if there are two): recorded as the request and a
    /// replay of it.
    Duplicate,
}

impl Kind {
    /// Whether a 2xx answer must leave exactly one audit event.
    fn mutates(self) -> bool {
        !matches!(
            self,
            Kind::DryRun | Kind::CapacityWithoutPermission | Kind::Replay | Kind::Duplicate
        )
    }

    fn audit_action(self) -> &'static str {
        match self {
            Kind::Release => "reservation.release",
            Kind::Reclaim => "reservation.reclaim",
            Kind::Place => "vm.place",
            Kind::Terminate => "vm.terminate",
            Kind::PutNode => "node.update",
            Kind::Reaffirm => "reservation.reaffirm",
            _ => "-",
        }
    }

    /// The statuses a correct service may answer.
    fn allowed_statuses(self) -> &'static [u16] {
        match self {
            // 409: the reservation is withheld for review, or a unit runs a non-spot VM.
            Kind::Release | Kind::Reclaim | Kind::DryRun => &[200, 409],
            Kind::CapacityWithoutPermission => &[404],
            // 409: refused by the placement rules or a unit is busy.
            Kind::Place => &[201, 409],
            // 404/403: the owner may only stop spot VMs on its reserved units.
            Kind::Terminate => &[200, 403, 404, 409],
            // 409: a removed unit still runs a VM.
            Kind::PutNode => &[200, 409],
            Kind::Reaffirm => &[200, 409],
            Kind::Replay | Kind::Duplicate => &[],
        }
    }
}

const WEIGHTS: [(Kind, usize); 10] = [
    (Kind::Release, 18),
    (Kind::Reclaim, 15),
    (Kind::DryRun, 8),
    (Kind::CapacityWithoutPermission, 3),
    (Kind::Place, 30),
    (Kind::Terminate, 10),
    (Kind::PutNode, 4),
    (Kind::Reaffirm, 6),
    (Kind::Replay, 6),
    (Kind::Duplicate, 5),
];

/// One HTTP request, kept so that it can be sent again byte for byte.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: &'static str,
    pub path: String,
    pub body: Option<String>,
    pub token: String,
    pub idempotency_key: Option<String>,
    pub prefer_minimal: bool,
    /// Who sends it (the token's key), for the model.
    pub actor: Actor,
}

/// One request as sent, and its answer.
#[derive(Debug, Clone)]
pub struct Record {
    pub kind: Kind,
    pub request: Request,
    pub request_id: String,
    pub base: String,
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    pub replayed: bool,
    /// For a replay: the request id of the record replayed.
    pub replay_of: Option<String>,
    /// Sent at the same time as an identical request with the same key.
    pub twin: bool,
    /// The logical clock when the request was sent and when its answer arrived.
    pub sent_at: u64,
    pub answered_at: u64,
    /// How many times it was sent again after a 503 that asked for a retry.
    pub retried: u32,
}

impl Record {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends `request` to `base` under `request_id`.
pub fn send(
    base: &str,
    request: &Request,
    request_id: &str,
) -> (u16, Option<String>, Vec<u8>, bool) {
    let mut client =
        Client::new(base, Some(request.token.clone())).with_header("x-request-id", request_id);
    if let Some(key) = &request.idempotency_key {
        client = client.with_header("idempotency-key", key);
    }
    if request.prefer_minimal {
        client = client.with_header("prefer", "return=minimal");
    }
    let reply = client.send(
        request.method,
        &request.path,
        request.body.as_ref().map(|_| "application/json"),
        request.body.as_deref().map(str::as_bytes),
    );
    let replayed = reply.header("idempotent-replayed") == Some("true");
    let content_type = reply.header("content-type").map(str::to_owned);
    (reply.status, content_type, reply.body, replayed)
}

/// What the threads share: VMs placed so far and those still running as far as the answers
/// tell (id, org), to pick termination targets from, and the logical clock.
struct Shared {
    placed: Mutex<Vec<(String, String)>>,
    running: Mutex<Vec<(String, String)>>,
    clock: AtomicU64,
}

impl Shared {
    /// Follows what an answer did to the set of running VMs: a placement adds one, a
    /// termination or a reclaim stops some.
    fn note(&self, record: &Record) {
        if record.replay_of.is_some() || !(200..300).contains(&record.status) {
            return;
        }
        let body = record.json();
        let stopped: Vec<String> = match record.kind {
            Kind::Place => {
                let vm = (
                    body["id"].as_str().unwrap_or_default().to_owned(),
                    body["orgId"].as_str().unwrap_or_default().to_owned(),
                );
                self.placed.lock().unwrap().push(vm.clone());
                self.running.lock().unwrap().push(vm);
                return;
            }
            Kind::Terminate => vec![body["id"].as_str().unwrap_or_default().to_owned()],
            Kind::Reclaim => string_items(&body["terminated"]),
            _ => return,
        };
        self.running
            .lock()
            .unwrap()
            .retain(|(id, _)| !stopped.contains(id));
    }

    /// A VM to terminate: mostly one still running (a generator that only picked among every
    /// VM ever placed would, in a long run, mostly ask to stop stopped VMs, and the units
    /// would fill up with VMs nobody stops), sometimes any placed one, so that refusing to
    /// stop a stopped VM is tried too.
    fn termination_target(&self, rng: &mut Rng) -> Option<(String, String)> {
        let running = self.running.lock().unwrap();
        if !running.is_empty() && rng.chance(85) {
            return Some(rng.pick(&running).clone());
        }
        let placed = self.placed.lock().unwrap();
        (!placed.is_empty()).then(|| rng.pick(&placed).clone())
    }
}

/// What `send` answers, with the clock's ticks just before sending and just after the answer,
/// and how many times it was sent again.
type Timed = ((u16, Option<String>, Vec<u8>, bool), u64, u64, u32);

/// How many times a client sends a request again when the answer asks it to.
const RETRIES: u32 = 6;

/// Sends `request`, and again, as the contract tells a client to, while the answer is a 503
/// that changed nothing and asks for a retry (`database-busy`, `write-contention`): on a
/// loaded machine the shared database's lock can stay taken past the app's own retries.
/// The effect, if any, falls between the first send and the last answer.
fn timed_send(shared: &Shared, base: &str, request: &Request, request_id: &str) -> Timed {
    let sent_at = shared.clock.fetch_add(1, Ordering::SeqCst);
    let mut retried = 0;
    let answer = loop {
        let answer = send(base, request, request_id);
        if retried == RETRIES || !asks_for_retry(answer.0, &answer.2) {
            break answer;
        }
        retried += 1;
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let answered_at = shared.clock.fetch_add(1, Ordering::SeqCst);
    (answer, sent_at, answered_at, retried)
}

/// Runs `threads` clients of `ops_per_thread` operations each, spread over `bases`.
pub fn run(
    market: &Market,
    bases: &[String],
    threads: usize,
    ops_per_thread: usize,
    seed: u64,
) -> Vec<Record> {
    let shared = Shared {
        placed: Mutex::new(Vec::new()),
        running: Mutex::new(Vec::new()),
        clock: AtomicU64::new(0),
    };
    let mut records = Vec::new();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let shared = &shared;
                scope.spawn(move || {
                    let mut rng =
                        Rng::new(seed ^ (thread as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
                    let mut mine: Vec<Record> = Vec::with_capacity(ops_per_thread);
                    for n in 0..ops_per_thread {
                        let request_id = format!("wl-{thread}-{n}");
                        let base = rng.pick(bases).clone();
                        let records = one_operation(
                            market, shared, &mut rng, &mine, bases, &base, request_id,
                        );
                        for record in records {
                            shared.note(&record);
                            mine.push(record);
                        }
                    }
                    mine
                })
            })
            .collect();
        for worker in workers {
            records.extend(worker.join().expect("a client thread panicked"));
        }
    });
    records
}

fn choose_kind(rng: &mut Rng) -> Kind {
    let total: usize = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut roll = rng.below(total);
    for (kind, weight) in WEIGHTS {
        if roll < weight {
            return kind;
        }
        roll -= weight;
    }
    unreachable!()
}

#[allow(clippy::too_many_arguments)]
fn one_operation(
    market: &Market,
    shared: &Shared,
    rng: &mut Rng,
    earlier: &[Record],
    bases: &[String],
    base: &str,
    request_id: String,
) -> Vec<Record> {
    let mut kind = choose_kind(rng);
    let replayable: Vec<&Record> = earlier
        .iter()
        // A read-only key's requests are never recorded (it may change nothing), so they have
        // no answer to replay.
        .filter(|r| {
            r.request.idempotency_key.is_some()
                && !matches!(r.kind, Kind::Replay | Kind::DryRun)
                && !matches!(r.request.actor, Actor::BrokerViewer)
        })
        .collect();
    if kind == Kind::Replay && replayable.is_empty() {
        kind = Kind::Place;
    }
    if kind == Kind::Replay {
        let original = *rng.pick(&replayable);
        let ((status, content_type, body, replayed), sent_at, answered_at, retried) =
            timed_send(shared, base, &original.request, &request_id);
        return vec![Record {
            kind,
            request: original.request.clone(),
            request_id,
            base: base.to_owned(),
            status,
            content_type,
            body,
            replayed,
            replay_of: Some(original.request_id.clone()),
            twin: false,
            sent_at,
            answered_at,
            retried,
        }];
    }
    if kind == Kind::Duplicate {
        let inner = *rng.pick(&[Kind::Release, Kind::Reclaim, Kind::Place]);
        let request = build_request(market, shared, rng, inner, &request_id);
        let twin_id = format!("{request_id}-twin");
        let twin_base = rng.pick(bases).clone();
        let (first, twin) = std::thread::scope(|scope| {
            let first = scope.spawn(|| timed_send(shared, base, &request, &request_id));
            let twin = timed_send(shared, &twin_base, &request, &twin_id);
            (first.join().expect("first of the twins"), twin)
        });
        let mut pair = [
            (request_id, base.to_owned(), first),
            (twin_id, twin_base, twin),
        ];
        // Whichever was carried out is the request; the other must be its replay.
        if pair[0].2.0.3 && !pair[1].2.0.3 {
            pair.swap(0, 1);
        }
        let original_id = pair[0].0.clone();
        return pair
            .into_iter()
            .enumerate()
            .map(
                |(
                    i,
                    (
                        id,
                        base,
                        ((status, content_type, body, replayed), sent_at, answered_at, retried),
                    ),
                )| Record {
                    kind: if i == 0 { inner } else { Kind::Replay },
                    request: request.clone(),
                    request_id: id,
                    base,
                    status,
                    content_type,
                    body,
                    replayed,
                    replay_of: (i == 1).then(|| original_id.clone()),
                    twin: true,
                    sent_at,
                    answered_at,
                    retried,
                },
            )
            .collect();
    }
    let request = build_request(market, shared, rng, kind, &request_id);
    let ((status, content_type, body, replayed), sent_at, answered_at, retried) =
        timed_send(shared, base, &request, &request_id);
    vec![Record {
        kind,
        request,
        request_id,
        base: base.to_owned(),
        status,
        content_type,
        body,
        replayed,
        replay_of: None,
        twin: false,
        sent_at,
        answered_at,
        retried,
    }]
}

fn build_request(
    market: &Market,
    shared: &Shared,
    rng: &mut Rng,
    kind: Kind,
    request_id: &str,
) -> Request {
    let key = Some(format!("key-{request_id}"));
    let post = |actor: &Actor, path: String, body: Value| Request {
        method: "POST",
        path,
        body: Some(body.to_string()),
        token: market.token(actor),
        idempotency_key: key.clone(),
        prefer_minimal: false,
        actor: actor.clone(),
    };
    let (node, reservation) = rng.pick(&market.reservations).clone();
    let capacity_path =
        |action: &str| format!("/v1/nodes/{node}/reservations/{reservation}/{action}");
    let capacity_body = |rng: &mut Rng| {
        json!({
            "unitIds": rng.subset(&RESERVED_UNITS, 1, 3),
            "reason": format!("workload {request_id}"),
        })
    };
    let capacity_actor = |rng: &mut Rng| {
        rng.pick(&[Actor::Owner, Actor::Broker, Actor::Operator])
            .clone()
    };
    match kind {
        Kind::Release | Kind::Reclaim | Kind::DryRun => {
            let action = match kind {
                Kind::Release => "release",
                Kind::Reclaim => "reclaim",
                _ => "reclaim/dry-run",
            };
            let actor = capacity_actor(rng);
            let mut request = post(&actor, capacity_path(action), capacity_body(rng));
            request.prefer_minimal = rng.chance(25);
            request
        }
        Kind::CapacityWithoutPermission => post(
            &Actor::BrokerViewer,
            capacity_path(if rng.chance(50) { "release" } else { "reclaim" }),
            capacity_body(rng),
        ),
        Kind::Place => {
            let org = rng
                .pick(&[AUDIENCE[0], AUDIENCE[1], OUTSIDERS[0], OUTSIDERS[1]])
                .to_string();
            let mut candidates: Vec<&str> = NODE_UNITS.to_vec();
            candidates.push(EXTRA_UNIT);
            let body = json!({
                "nodeId": node,
                "unitIds": rng.subset(&candidates, 1, 2),
                "tier": rng.pick(&TIERS),
            });
            post(&Actor::Member(org), "/v1/vms".into(), body)
        }
        Kind::Terminate => {
            let target = shared.termination_target(rng);
            let (vm, org) = target.unwrap_or_else(|| ("vm-none".into(), AUDIENCE[0].into()));
            let actor = rng
                .pick(&[Actor::Member(org), Actor::Operator, Actor::Owner])
                .clone();
            Request {
                method: "DELETE",
                path: format!("/v1/vms/{vm}"),
                body: None,
                token: market.token(&actor),
                idempotency_key: None,
                prefer_minimal: false,
                actor,
            }
        }
        Kind::PutNode => {
            let mut units: Vec<&str> = NODE_UNITS.to_vec();
            if rng.chance(50) {
                units.push(EXTRA_UNIT);
            }
            let actor = rng.pick(&[Actor::Owner, Actor::Operator]).clone();
            Request {
                method: "PUT",
                path: format!("/v1/nodes/{node}"),
                body: Some(json!({ "ownerOrgId": "owner", "unitIds": units }).to_string()),
                token: market.token(&actor),
                idempotency_key: None,
                prefer_minimal: false,
                actor,
            }
        }
        Kind::Reaffirm => post(
            &Actor::Operator,
            capacity_path("reaffirm"),
            json!({ "reason": format!("reaffirmed by {request_id}") }),
        ),
        Kind::Replay | Kind::Duplicate => unreachable!("built from other requests"),
    }
}

// ------------------------------------------------------------------------- the checks

/// What the checks counted.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub by_kind: BTreeMap<String, BTreeMap<u16, usize>>,
    pub invariants_checked: usize,
    pub audit_events: usize,
    /// Answers the model decided (every record but replays).
    pub answers_checked: usize,
    /// Requests sent again after a 503 that asked for a retry.
    pub retried: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    fn check(&mut self, holds: bool, violation: impl FnOnce() -> String) {
        self.invariants_checked += 1;
        if !holds {
            self.violations.push(violation());
        }
    }

    pub fn print(&self, title: &str) {
        println!(
            "{title}: {} operations ({} sent again after a 503 that asked for it), {} answers decided by the model, {} audit events replayed, {} invariant checks, {} violations",
            self.operations,
            self.retried,
            self.answers_checked,
            self.audit_events,
            self.invariants_checked,
            self.violations.len()
        );
        for (kind, statuses) in &self.by_kind {
            println!("  {kind:<28} {statuses:?}");
        }
    }

    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(
            self.violations.is_empty(),
            "{} violations:\n{}",
            self.violations.len(),
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// One audit event, as stored.
#[derive(Debug, Clone)]
struct Event {
    seq: i64,
    action: String,
    node_id: Option<String>,
    reservation_id: Option<String>,
    vm_id: Option<String>,
    org_id: Option<String>,
    unit_ids: Vec<String>,
    terminated: Vec<String>,
    skipped: Vec<String>,
    request_id: String,
}

fn list(text: Option<String>) -> Vec<String> {
    text.map(|t| serde_json::from_str(&t).expect("a JSON list"))
        .unwrap_or_default()
}

fn events(db: &rusqlite::Connection) -> Vec<Event> {
    let mut statement = db
        .prepare(
            "SELECT seq, action, node_id, reservation_id, vm_id, org_id, unit_ids, terminated, \
             skipped, coalesce(client_request_id, request_id) FROM audit_events ORDER BY seq",
        )
        .unwrap();
    statement
        .query_map([], |r| {
            Ok(Event {
                seq: r.get(0)?,
                action: r.get(1)?,
                node_id: r.get(2)?,
                reservation_id: r.get(3)?,
                vm_id: r.get(4)?,
                org_id: r.get(5)?,
                unit_ids: list(r.get(6)?),
                terminated: list(r.get(7)?),
                skipped: list(r.get(8)?),
                request_id: r.get(9)?,
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The last audit sequence number: events after it belong to the workload.
pub fn last_seq(db: &rusqlite::Connection) -> i64 {
    db.query_row("SELECT coalesce(max(seq), 0) FROM audit_events", [], |r| {
        r.get(0)
    })
    .unwrap()
}

#[derive(Debug, Clone)]
struct ModelReservation {
    node: String,
    units: BTreeSet<String>,
    released: BTreeSet<String>,
    state: &'static str,
    audience: Vec<String>,
    /// Who may see it: the node's owner, managing orgs and the audience.
    parties: Vec<String>,
}

#[derive(Debug, Clone)]
struct ModelVm {
    org: String,
    node: String,
    units: Vec<String>,
    tier: String,
    running: bool,
    reclaimed: bool,
}

/// The rules of docs/design.md as a model, driven by the audit trail in commit order.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, BTreeSet<String>>,
    reservations: BTreeMap<String, ModelReservation>,
    vms: BTreeMap<String, ModelVm>,
    /// The running VMs on each (node, unit), an index over `vms`.
    running: BTreeMap<(String, String), BTreeSet<String>>,
    /// Released set right after each release/reclaim event, by request id.
    released_after: HashMap<String, BTreeSet<String>>,
}

impl Model {
    /// The running VMs on any of `units` of `node`, each once, by id.
    fn running_on<'a>(
        &'a self,
        node: &'a str,
        units: &'a [String],
    ) -> impl Iterator<Item = (&'a String, &'a ModelVm)> + 'a {
        let ids: BTreeSet<&String> = units
            .iter()
            .filter_map(|u| self.running.get(&(node.to_owned(), u.clone())))
            .flatten()
            .collect();
        ids.into_iter().map(|id| (id, &self.vms[id]))
    }

    fn set_running(&mut self, id: &str, running: bool) {
        let Some(vm) = self.vms.get_mut(id) else {
            return;
        };
        vm.running = running;
        for unit in &vm.units {
            let on_unit = self
                .running
                .entry((vm.node.clone(), unit.clone()))
                .or_default();
            if running {
                on_unit.insert(id.to_owned());
            } else {
                on_unit.remove(id);
            }
        }
    }

    fn holders<'a>(
        &'a self,
        node: &'a str,
        unit: &'a str,
    ) -> impl Iterator<Item = &'a ModelReservation> + 'a {
        self.reservations
            .values()
            .filter(move |r| r.state != "cancelled" && r.node == node && r.units.contains(unit))
    }
}

/// Replays the audit trail, checking at each event that the rules held at that instant, and
/// returns the model of the final state. `observe` sees the model after each event.
fn replay(
    db: &rusqlite::Connection,
    events: &[Event],
    verdict: &mut Verdict,
    mut observe: impl FnMut(&Model, i64),
) -> Model {
    let audiences: HashMap<String, (Vec<String>, Vec<String>)> = db
        .prepare(
            "SELECT r.id, r.allowed_org_ids, r.managing_org_ids, n.owner_org_id \
             FROM reservations r JOIN nodes n ON n.id = r.node_id",
        )
        .unwrap()
        .query_map([], |r| {
            let audience = list(r.get(1)?);
            let mut parties = list(r.get(2)?);
            parties.push(r.get(3)?);
            parties.extend(audience.iter().cloned());
            Ok((r.get(0)?, (audience, parties)))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let tiers: HashMap<String, String> = db
        .prepare("SELECT id, tier FROM vms")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut model = Model::default();
    for event in events {
        let at = format!(
            "event {} ({}, {})",
            event.seq, event.action, event.request_id
        );
        let node = event.node_id.clone().unwrap_or_default();
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        match event.action.as_str() {
            "node.create" => {
                model
                    .nodes
                    .insert(node, event.unit_ids.iter().cloned().collect());
            }
            "node.update" => {
                let new_units: BTreeSet<String> = event.unit_ids.iter().cloned().collect();
                let changed = model.nodes.get(&node) != Some(&new_units);
                let expected_withheld: Vec<String> = if changed {
                    model
                        .reservations
                        .iter()
                        .filter(|(_, r)| r.node == node && r.state == "live")
                        .map(|(id, _)| id.clone())
                        .collect()
                } else {
                    Vec::new()
                };
                verdict.check(event.skipped == expected_withheld, || {
                    format!(
                        "{at}: withheld {:?}, the rule says {expected_withheld:?}",
                        event.skipped
                    )
                });
                let removed: Vec<String> =
                    model.nodes[&node].difference(&new_units).cloned().collect();
                let busy: Vec<&String> = model
                    .running_on(&node, &removed)
                    .map(|(id, _)| id)
                    .collect();
                verdict.check(busy.is_empty(), || {
                    format!("{at}: removed units {removed:?} while VMs {busy:?} ran on them")
                });
                for id in &expected_withheld {
                    model.reservations.get_mut(id).unwrap().state = "needs-review";
                }
                model.nodes.insert(node, new_units);
            }
            "reservation.create" => {
                model.reservations.insert(
                    reservation_id.clone(),
                    ModelReservation {
                        node,
                        units: event.unit_ids.iter().cloned().collect(),
                        released: BTreeSet::new(),
                        state: "live",
                        audience: audiences
                            .get(&reservation_id)
                            .map(|(audience, _)| audience.clone())
                            .unwrap_or_default(),
                        parties: audiences
                            .get(&reservation_id)
                            .map(|(_, parties)| parties.clone())
                            .unwrap_or_default(),
                    },
                );
            }
            "reservation.reaffirm" => {
                let node_units = model.nodes[&node].clone();
                let r = model.reservations.get_mut(&reservation_id).unwrap();
                verdict.check(r.state == "needs-review", || {
                    format!("{at}: re-affirmed a reservation in state {}", r.state)
                });
                r.units = event.unit_ids.iter().cloned().collect();
                verdict.check(r.units.is_subset(&node_units), || {
                    format!("{at}: re-affirmed units {:?} not all on the node", r.units)
                });
                r.released = r.released.intersection(&r.units).cloned().collect();
                r.state = "live";
            }
            "reservation.cancel" => {
                model.reservations.get_mut(&reservation_id).unwrap().state = "cancelled";
            }
            "reservation.release" => {
                let non_spot: Vec<String> = model
                    .running_on(&node, &event.unit_ids)
                    .filter(|(_, vm)| vm.tier != "spot")
                    .map(|(id, _)| id.clone())
                    .collect();
                verdict.check(non_spot.is_empty(), || {
                    format!("{at}: released units under non-spot VMs {non_spot:?}")
                });
                let r = model.reservations.get_mut(&reservation_id).unwrap();
                verdict.check(r.state == "live", || {
                    format!("{at}: released units of a reservation in state {}", r.state)
                });
                verdict.check(event.unit_ids.iter().all(|u| r.units.contains(u)), || {
                    format!("{at}: released units outside the reservation")
                });
                r.released.extend(event.unit_ids.iter().cloned());
                model
                    .released_after
                    .insert(event.request_id.clone(), r.released.clone());
            }
            "reservation.reclaim" => {
                let (mut spot, mut other): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
                for (id, vm) in model.running_on(&node, &event.unit_ids) {
                    if vm.tier == "spot" {
                        spot.push(id.clone());
                    } else {
                        other.push(id.clone());
                    }
                }
                verdict.check(event.terminated == spot, || {
                    format!(
                        "{at}: terminated {:?}, the spot VMs on those units were {spot:?}",
                        event.terminated
                    )
                });
                verdict.check(event.skipped == other, || {
                    format!(
                        "{at}: skipped {:?}, the non-spot VMs on those units were {other:?}",
                        event.skipped
                    )
                });
                for id in &event.terminated {
                    if let Some(vm) = model.vms.get_mut(id) {
                        vm.reclaimed = true;
                    }
                    model.set_running(id, false);
                }
                let r = model.reservations.get_mut(&reservation_id).unwrap();
                verdict.check(r.state == "live", || {
                    format!(
                        "{at}: reclaimed units of a reservation in state {}",
                        r.state
                    )
                });
                for unit in &event.unit_ids {
                    r.released.remove(unit);
                }
                model
                    .released_after
                    .insert(event.request_id.clone(), r.released.clone());
            }
            "vm.place" => {
                let vm_id = event.vm_id.clone().unwrap_or_default();
                let org = event.org_id.clone().unwrap_or_default();
                let tier = tiers.get(&vm_id).cloned().unwrap_or_default();
                verdict.check(!model.vms.contains_key(&vm_id), || {
                    format!("{at}: VM {vm_id} placed twice")
                });
                for unit in &event.unit_ids {
                    verdict.check(
                        model.nodes.get(&node).is_some_and(|u| u.contains(unit)),
                        || format!("{at}: placed on {unit}, not a unit of {node}"),
                    );
                    let busy: Vec<&String> = model
                        .running_on(&node, std::slice::from_ref(unit))
                        .map(|(id, _)| id)
                        .collect();
                    verdict.check(busy.is_empty(), || {
                        format!("{at}: placed on {unit}, which ran {busy:?}")
                    });
                    for holder in model.holders(&node, unit) {
                        verdict.check(holder.state != "needs-review", || {
                            format!("{at}: placed on {unit} of a needs-review reservation")
                        });
                        if holder.state == "live" && holder.released.contains(unit) {
                            verdict.check(tier == "spot", || {
                                format!("{at}: {tier} VM placed on released unit {unit}")
                            });
                        } else if holder.state == "live" {
                            verdict.check(holder.audience.contains(&org), || {
                                format!(
                                    "{at}: {org} placed on {unit} reserved for {:?}",
                                    holder.audience
                                )
                            });
                        }
                    }
                }
                model.vms.insert(
                    vm_id.clone(),
                    ModelVm {
                        org,
                        node,
                        units: event.unit_ids.clone(),
                        tier,
                        running: false,
                        reclaimed: false,
                    },
                );
                model.set_running(&vm_id, true);
            }
            "vm.terminate" => {
                let vm_id = event.vm_id.clone().unwrap_or_default();
                let vm = model.vms.get_mut(&vm_id);
                verdict.check(vm.as_ref().is_some_and(|vm| vm.running), || {
                    format!("{at}: terminated {vm_id}, which was not running")
                });
                if vm.is_some() {
                    model.set_running(&vm_id, false);
                }
            }
            _ => {}
        }
        observe(&model, event.seq);
    }
    model
}

// ------------------------------------------------------------------------- the model's answers

fn problem(status: u16, code: &str) -> Value {
    json!({ "status": status, "code": code })
}

fn sorted_list<T: AsRef<str>>(items: impl IntoIterator<Item = T>) -> Value {
    let set: BTreeSet<String> = items.into_iter().map(|i| i.as_ref().to_owned()).collect();
    json!(set)
}

/// The parts of an answer the model decides: the status, and for a refusal its code and the
/// ids it names; for a dry run what it would terminate and skip.
fn observed(record: &Record) -> Value {
    let body = record.json();
    if (200..300).contains(&record.status) {
        let mut outcome = json!({ "status": record.status });
        if record.kind == Kind::DryRun {
            for member in ["wouldTerminate", "wouldSkip"] {
                outcome[member] = sorted_strings(&body[member]).map_or(Value::Null, |l| json!(l));
            }
        }
        return outcome;
    }
    let code = body["code"].as_str().unwrap_or_default();
    let mut outcome = problem(record.status, code);
    let sorted = |member: &str| sorted_strings(&body[member]).map_or(Value::Null, |l| json!(l));
    match code {
        "units-not-in-reservation" | "units-in-use" => outcome["unitIds"] = sorted("unitIds"),
        "units-not-idle" => {
            outcome["unitIds"] = sorted("unitIds");
            outcome["vmIds"] = sorted("vmIds");
        }
        "reservation-not-active" | "reservation-not-needs-review" => {
            outcome["reservationStatus"] = body["reservationStatus"].clone();
        }
        "placement-refused" => outcome["refusals"] = body["refusals"].clone(),
        _ => {}
    }
    outcome
}

fn status_of(reservation: &ModelReservation) -> &'static str {
    match reservation.state {
        "live" => "active",
        other => other,
    }
}

/// The strings of a JSON array, in order (anything else in it, or no array, is left out: the
/// model answers whatever the request's body was).
fn string_items(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Model {
    /// What the service must answer to `request` (not a replay) in this state.
    fn answer(&self, kind: Kind, request: &Request) -> Value {
        let body: Value = request.body.as_deref().map_or(Value::Null, |b| {
            serde_json::from_str(b).unwrap_or(Value::Null)
        });
        let units: Vec<String> = string_items(&body["unitIds"]);
        let segments: Vec<&str> = request.path.split('/').collect();
        match kind {
            Kind::CapacityWithoutPermission => problem(404, "not-found"),
            Kind::Release | Kind::Reclaim | Kind::DryRun => {
                // /v1/nodes/{node}/reservations/{id}/{action}
                let (node, id) = (segments[3], segments[5]);
                let Some(r) = self.reservations.get(id) else {
                    return problem(404, "not-found");
                };
                let strangers: Vec<&String> =
                    units.iter().filter(|u| !r.units.contains(*u)).collect();
                if !strangers.is_empty() {
                    let mut p = problem(422, "units-not-in-reservation");
                    p["unitIds"] = sorted_list(strangers);
                    return p;
                }
                if r.state != "live" {
                    let mut p = problem(409, "reservation-not-active");
                    p["reservationStatus"] = json!(status_of(r));
                    return p;
                }
                let (spot, other): (Vec<_>, Vec<_>) = self
                    .running_on(node, &units)
                    .partition(|(_, vm)| vm.tier == "spot");
                match kind {
                    Kind::Release if !other.is_empty() => {
                        let mut p = problem(409, "units-not-idle");
                        p["unitIds"] = sorted_list(
                            other
                                .iter()
                                .flat_map(|(_, vm)| vm.units.iter().filter(|u| units.contains(u))),
                        );
                        p["vmIds"] = sorted_list(other.iter().map(|(id, _)| id));
                        p
                    }
                    Kind::DryRun => json!({
                        "status": 200,
                        "wouldTerminate": sorted_list(spot.iter().map(|(id, _)| id)),
                        "wouldSkip": sorted_list(other.iter().map(|(id, _)| id)),
                    }),
                    _ => json!({ "status": 200 }),
                }
            }
            Kind::Place => {
                let Actor::Member(org) = &request.actor else {
                    return problem(403, "forbidden");
                };
                let node = body["nodeId"].as_str().unwrap_or_default();
                let tier = body["tier"].as_str().unwrap_or_default();
                let Some(node_units) = self.nodes.get(node) else {
                    return problem(404, "not-found");
                };
                let refusals: Vec<Value> = units
                    .iter()
                    .filter_map(|unit| {
                        self.refusal(org, tier, node, node_units, unit)
                            .map(|reason| json!({ "unitId": unit, "reason": reason }))
                    })
                    .collect();
                if refusals.is_empty() {
                    json!({ "status": 201 })
                } else {
                    let mut p = problem(409, "placement-refused");
                    p["refusals"] = json!(refusals);
                    p
                }
            }
            Kind::Terminate => {
                let id = request.path.trim_start_matches("/v1/vms/");
                let Some(vm) = self.vms.get(id) else {
                    return problem(404, "not-found");
                };
                let manages = vm.units.iter().any(|unit| {
                    self.holders(&vm.node, unit)
                        .any(|r| r.state == "live" && r.units.contains(unit))
                });
                let allowed = match &request.actor {
                    Actor::Operator => true,
                    Actor::Member(org) if *org == vm.org => true,
                    Actor::Owner | Actor::Broker if manages && vm.tier == "spot" => true,
                    Actor::Owner | Actor::Broker if manages => return problem(403, "forbidden"),
                    _ => return problem(404, "not-found"),
                };
                if allowed && !vm.running {
                    problem(409, "vm-terminated")
                } else {
                    json!({ "status": 200 })
                }
            }
            Kind::PutNode => {
                let node = segments[3];
                let new_units: BTreeSet<String> =
                    string_items(&body["unitIds"]).into_iter().collect();
                let removed: Vec<String> = self
                    .nodes
                    .get(node)
                    .map(|units| units.difference(&new_units).cloned().collect())
                    .unwrap_or_default();
                let busy: Vec<&String> = removed
                    .iter()
                    .filter(|u| {
                        self.running
                            .get(&(node.to_owned(), (*u).clone()))
                            .is_some_and(|ids| !ids.is_empty())
                    })
                    .collect();
                if busy.is_empty() {
                    json!({ "status": 200 })
                } else {
                    let mut p = problem(409, "units-in-use");
                    p["unitIds"] = sorted_list(busy);
                    p
                }
            }
            Kind::Reaffirm => {
                let Some(r) = self.reservations.get(segments[5]) else {
                    return problem(404, "not-found");
                };
                if r.state == "needs-review" {
                    json!({ "status": 200 })
                } else {
                    let mut p = problem(409, "reservation-not-needs-review");
                    p["reservationStatus"] = json!(status_of(r));
                    p
                }
            }
            Kind::Replay | Kind::Duplicate => Value::Null,
        }
    }

    /// Why `org` may not place a `tier` VM on `unit` of `node`, as the placement rules
    /// (docs/design.md, "Placement") say (the reservations here are all inside their term).
    fn refusal(
        &self,
        org: &str,
        tier: &str,
        node: &str,
        node_units: &BTreeSet<String>,
        unit: &str,
    ) -> Option<&'static str> {
        if !node_units.contains(unit) {
            return Some("unknown-unit");
        }
        if self
            .running
            .get(&(node.to_owned(), unit.to_owned()))
            .is_some_and(|ids| !ids.is_empty())
        {
            return Some("unit-busy");
        }
        let holders: Vec<&ModelReservation> = self.holders(node, unit).collect();
        // A refusal caused by a reservation says why only to its parties.
        let because_of = |r: &ModelReservation, reason| {
            Some(if r.parties.iter().any(|o| o == org) {
                reason
            } else {
                "unavailable"
            })
        };
        if let Some(withheld) = holders.iter().find(|r| r.state == "needs-review") {
            return because_of(withheld, "withheld-needs-review");
        }
        if let Some(active) = holders.iter().find(|r| r.state == "live") {
            if active.released.contains(unit) {
                return (tier != "spot").then_some("released-spot-only");
            }
            if active.audience.iter().any(|o| o == org) {
                return None;
            }
            return because_of(active, "reserved-for-audience");
        }
        None
    }
}

/// A request whose answer the model must give in one of the states after events `lo..=hi`.
struct Expectation {
    record: usize,
    lo: i64,
    hi: i64,
    /// What the model answered at the first state of the window, for the report.
    first_answer: Option<Value>,
}

/// For every record that is not a replay, the window of states it may have seen: exactly
/// the state before its own event for a 2xx mutation, else from the last commit answered
/// before it was sent to the state before the first commit of a request sent after its answer.
fn expectations(
    records: &[Record],
    by_request: &HashMap<&str, &Event>,
    from_seq: i64,
    last_seq: i64,
) -> Vec<Expectation> {
    let committed: Vec<(u64, u64, i64)> = records
        .iter()
        .filter_map(|r| {
            let event = by_request.get(r.request_id.as_str())?;
            Some((r.sent_at, r.answered_at, event.seq))
        })
        .collect();
    let mut by_answer: Vec<(u64, i64)> = committed.iter().map(|c| (c.1, c.2)).collect();
    by_answer.sort();
    let mut prefix_max = Vec::with_capacity(by_answer.len());
    let mut max = from_seq;
    for (_, seq) in &by_answer {
        max = max.max(*seq);
        prefix_max.push(max);
    }
    let mut by_send: Vec<(u64, i64)> = committed.iter().map(|c| (c.0, c.2)).collect();
    by_send.sort();
    let mut suffix_min = vec![last_seq + 1; by_send.len() + 1];
    for i in (0..by_send.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(by_send[i].1);
    }
    let mut expectations = Vec::new();
    for (index, record) in records.iter().enumerate() {
        if record.replay_of.is_some() || record.status >= 500 {
            continue;
        }
        let (lo, hi) = match by_request.get(record.request_id.as_str()) {
            Some(event) if record.kind.mutates() => (event.seq - 1, event.seq - 1),
            _ => {
                let before = by_answer.partition_point(|(at, _)| *at < record.sent_at);
                let lo = if before == 0 {
                    from_seq
                } else {
                    prefix_max[before - 1]
                };
                let after = by_send.partition_point(|(at, _)| *at <= record.answered_at);
                (lo, suffix_min[after] - 1)
            }
        };
        expectations.push(Expectation {
            record: index,
            lo,
            hi,
            first_answer: None,
        });
    }
    expectations.sort_by_key(|e| e.lo);
    expectations
}

/// Checks, while the audit trail is replayed, that the model gives each record's answer in
/// one of the states of its window; reports every record for which it never does.
struct AnswerCheck<'a> {
    records: &'a [Record],
    pending: std::collections::VecDeque<Expectation>,
    active: Vec<(Expectation, Value)>,
    failures: Vec<String>,
}

impl<'a> AnswerCheck<'a> {
    fn new(records: &'a [Record], expectations: Vec<Expectation>) -> AnswerCheck<'a> {
        AnswerCheck {
            records,
            pending: expectations.into(),
            active: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn observe(&mut self, model: &Model, seq: i64) {
        while self.pending.front().is_some_and(|e| e.lo <= seq) {
            let expectation = self.pending.pop_front().unwrap();
            let answer = observed(&self.records[expectation.record]);
            self.active.push((expectation, answer));
        }
        let records = self.records;
        let failures = &mut self.failures;
        self.active.retain_mut(|(expectation, observed)| {
            if expectation.hi < seq {
                failures.push(Self::failure(records, expectation, observed));
                return false;
            }
            if seq < expectation.lo {
                return true;
            }
            let record = &records[expectation.record];
            let answer = model.answer(record.kind, &record.request);
            let matched = answer == *observed;
            expectation.first_answer.get_or_insert(answer);
            !matched
        });
    }

    fn failure(records: &[Record], expectation: &Expectation, observed: &Value) -> String {
        let record = &records[expectation.record];
        format!(
            "{} {:?} {} {} {}: answered {observed}; in the states after events {}..={} the model answers {}",
            record.request_id,
            record.kind,
            record.request.method,
            record.request.path,
            record.request.body.as_deref().unwrap_or(""),
            expectation.lo,
            expectation.hi,
            expectation.first_answer.as_ref().map_or(
                "nothing (no state in the window)".to_owned(),
                Value::to_string
            )
        )
    }

    fn finish(mut self) -> Vec<String> {
        for (expectation, observed) in &self.active {
            self.failures
                .push(Self::failure(self.records, expectation, observed));
        }
        for expectation in &self.pending {
            let observed = observed(&self.records[expectation.record]);
            self.failures
                .push(Self::failure(self.records, expectation, &observed));
        }
        self.failures
    }
}

/// The smallest share of mutations (release, reclaim, placement, termination) that must
/// succeed in a run of the workload (typically 40-50 %), and of each of them (placements are
/// the rarest, ~25 %: units are often busy). A backstop to the model's exact answers: a run
/// that barely mutates anything proves little.
const MIN_SUCCESS_PERCENT: usize = 30;
const MIN_SUCCESS_PERCENT_PER_KIND: usize = 10;
/// A kind's share is judged only over this many requests of it: of four terminations all
/// four may be refused rightly (their VMs were already gone), which says nothing.
const MIN_REQUESTS_PER_KIND: usize = 40;
/// The whole share is judged only over this many mutations: the short healthy run after the
/// fault suite's faults (about 80) lands below 30 % now and then on its random draw alone.
const MIN_MUTATIONS_JUDGED: usize = 200;

fn check_success_share(records: &[Record], verdict: &mut Verdict) {
    let mut total = (0, 0);
    for kind in [Kind::Release, Kind::Reclaim, Kind::Place, Kind::Terminate] {
        let of_kind: Vec<&Record> = records
            .iter()
            .filter(|r| r.kind == kind && r.replay_of.is_none())
            .collect();
        let succeeded = of_kind
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .count();
        total = (total.0 + succeeded, total.1 + of_kind.len());
        let judged = of_kind.len() >= MIN_REQUESTS_PER_KIND;
        verdict.check(!judged || succeeded * 100 >= of_kind.len() * MIN_SUCCESS_PERCENT_PER_KIND, || {
            format!(
                "only {succeeded} of {} {kind:?} requests succeeded (at least {MIN_SUCCESS_PERCENT_PER_KIND}% must)",
                of_kind.len()
            )
        });
    }
    let judged = total.1 >= MIN_MUTATIONS_JUDGED;
    verdict.check(
        !judged || total.0 * 100 >= total.1 * MIN_SUCCESS_PERCENT,
        || {
            format!(
                "only {} of {} mutations succeeded (at least {MIN_SUCCESS_PERCENT}% must)",
                total.0, total.1
            )
        },
    );
}

/// Every check of the invariants (docs/design.md) over the records of a run and the
/// database after it.
pub fn verify(
    app_db: &rusqlite::Connection,
    operator: &Client,
    records: &[Record],
    workload_from_seq: i64,
) -> Verdict {
    let mut verdict = Verdict {
        operations: records.len(),
        retried: records.iter().filter(|r| r.retried > 0).count(),
        ..Verdict::default()
    };
    for record in records {
        *verdict
            .by_kind
            .entry(if record.twin {
                format!("{:?} (concurrent twin)", record.kind)
            } else {
                format!("{:?}", record.kind)
            })
            .or_default()
            .entry(record.status)
            .or_default() += 1;
    }
    check_responses(records, &mut verdict);
    let events = events(app_db);
    verdict.audit_events = events.len();
    check_audit_matches_responses(&events, records, workload_from_seq, &mut verdict);
    check_success_share(records, &mut verdict);
    let by_request: HashMap<&str, &Event> = events
        .iter()
        .filter(|e| e.seq > workload_from_seq)
        .map(|e| (e.request_id.as_str(), e))
        .collect();
    let last = events.last().map_or(0, |e| e.seq);
    let mut answers = AnswerCheck::new(
        records,
        expectations(records, &by_request, workload_from_seq, last),
    );
    let model = replay(app_db, &events, &mut verdict, |model, seq| {
        answers.observe(model, seq)
    });
    let failures = answers.finish();
    verdict.answers_checked = records.iter().filter(|r| r.replay_of.is_none()).count();
    for failure in failures {
        verdict.check(false, || failure);
    }
    check_responses_against_history(&model, app_db, records, &mut verdict);
    check_database(app_db, &model, &mut verdict);
    let verification = operator.get("/v1/audit/verify").expect_status(200).json();
    verdict.check(verification["ok"] == true, || {
        format!("the audit chain does not verify: {verification}")
    });
    verdict.check(
        verification["eventsChecked"].as_u64() == Some(events.len() as u64),
        || {
            format!(
                "verified {} of {} events",
                verification["eventsChecked"],
                events.len()
            )
        },
    );
    verdict
}

fn check_responses(records: &[Record], verdict: &mut Verdict) {
    let by_id: HashMap<&str, &Record> =
        records.iter().map(|r| (r.request_id.as_str(), r)).collect();
    for record in records {
        let what = format!(
            "{} {:?} {} {}{}",
            record.request_id, record.kind, record.request.method, record.base, record.request.path
        );
        verdict.check(record.status < 500, || {
            format!(
                "{what}: {} {}",
                record.status,
                String::from_utf8_lossy(&record.body)
            )
        });
        if record.status >= 400 {
            let problem = record.json();
            verdict.check(
                record.content_type.as_deref() == Some("application/problem+json")
                    && problem["code"].is_string()
                    && problem["status"] == record.status,
                || {
                    format!(
                        "{what}: not a problem document: {}",
                        String::from_utf8_lossy(&record.body)
                    )
                },
            );
        }
        if let Some(original) = &record.replay_of {
            let original = by_id[original.as_str()];
            verdict.check(
                record.replayed && record.status == original.status && record.body == original.body,
                || {
                    format!(
                        "{what}: replay of {} answered {} (replayed: {}) {}, first answer {} {}",
                        original.request_id,
                        record.status,
                        record.replayed,
                        String::from_utf8_lossy(&record.body),
                        original.status,
                        String::from_utf8_lossy(&original.body)
                    )
                },
            );
        } else {
            verdict.check(!record.replayed, || format!("{what}: answered as a replay"));
            verdict.check(
                record.kind.allowed_statuses().contains(&record.status),
                || {
                    format!(
                        "{what}: unexpected {} {}",
                        record.status,
                        String::from_utf8_lossy(&record.body)
                    )
                },
            );
        }
    }
}

/// One audit event per 2xx mutation, none for anything else, each of the right action.
fn check_audit_matches_responses(
    events: &[Event],
    records: &[Record],
    from_seq: i64,
    verdict: &mut Verdict,
) {
    let mut by_request: HashMap<&str, Vec<&Event>> = HashMap::new();
    for event in events.iter().filter(|e| e.seq > from_seq) {
        by_request
            .entry(event.request_id.as_str())
            .or_default()
            .push(event);
    }
    let mut matched = 0;
    for record in records {
        let found = by_request
            .remove(record.request_id.as_str())
            .unwrap_or_default();
        let should_write = record.kind.mutates() && (200..300).contains(&record.status);
        if should_write {
            matched += 1;
            verdict.check(
                found.len() == 1 && found[0].action == record.kind.audit_action(),
                || {
                    format!(
                        "{} {:?} {}: audit events {found:?}",
                        record.request_id, record.kind, record.status
                    )
                },
            );
        } else {
            verdict.check(found.is_empty(), || {
                format!(
                    "{} {:?} {} left audit events {found:?}",
                    record.request_id, record.kind, record.status
                )
            });
        }
    }
    verdict.check(by_request.is_empty(), || {
        format!("audit events of no request of the workload: {by_request:?}")
    });
    let workload_events = events.iter().filter(|e| e.seq > from_seq).count();
    verdict.check(workload_events == matched, || {
        format!("{workload_events} audit events for {matched} successful mutations")
    });
}

fn sorted_strings(value: &Value) -> Option<Vec<String>> {
    let mut list: Vec<String> = value
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    list.sort();
    Some(list)
}

/// Each 2xx answer agrees with the state history: release/reclaim answers show the released
/// set right after their commit and name the VMs the audit names; placements and
/// terminations are in the database as answered.
fn check_responses_against_history(
    model: &Model,
    db: &rusqlite::Connection,
    records: &[Record],
    verdict: &mut Verdict,
) {
    let events = events(db);
    let by_request: HashMap<&str, &Event> =
        events.iter().map(|e| (e.request_id.as_str(), e)).collect();
    for record in records
        .iter()
        .filter(|r| r.replay_of.is_none() && (200..300).contains(&r.status))
    {
        let body = record.json();
        let what = format!("{} {:?}", record.request_id, record.kind);
        match record.kind {
            Kind::Release | Kind::Reclaim => {
                if let Some(released) = sorted_strings(&body["releasedUnitIds"]) {
                    // None when the audit trail lacks the request's event (reported above).
                    let expected: Option<Vec<String>> = model
                        .released_after
                        .get(record.request_id.as_str())
                        .map(|units| units.iter().cloned().collect());
                    verdict.check(expected.as_ref() == Some(&released), || {
                        format!("{what}: answered released {released:?}, right after its commit it was {expected:?}")
                    });
                } else {
                    verdict.check(record.request.prefer_minimal, || {
                        format!("{what}: no releasedUnitIds")
                    });
                }
                if record.kind == Kind::Reclaim
                    && let Some(event) = by_request.get(record.request_id.as_str())
                {
                    verdict.check(
                        body["terminated"] == json!(event.terminated)
                            && body["skipped"] == json!(event.skipped),
                        || format!("{what}: answered {body}, audit says {event:?}"),
                    );
                    for vm in &event.terminated {
                        let reason: Option<String> = db
                            .query_row(
                                "SELECT termination_reason FROM vms WHERE id = ?",
                                [vm],
                                |r| r.get(0),
                            )
                            .unwrap_or(None);
                        verdict.check(reason.as_deref() == Some("reclaimed"), || {
                            format!(
                                "{what}: terminated {vm}, whose termination reason is {reason:?}"
                            )
                        });
                    }
                }
            }
            Kind::Place => {
                let id = body["id"].as_str().unwrap_or_default();
                let rows: Vec<(String, String, String)> = db
                    .prepare("SELECT org_id, node_id, tier FROM vms WHERE id = ?")
                    .unwrap()
                    .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let units: Vec<String> = db
                    .prepare("SELECT unit_id FROM vm_units WHERE vm_id = ? ORDER BY position")
                    .unwrap()
                    .query_map([id], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let expected = (
                    body["orgId"].as_str().unwrap_or_default().to_owned(),
                    body["nodeId"].as_str().unwrap_or_default().to_owned(),
                    body["tier"].as_str().unwrap_or_default().to_owned(),
                );
                verdict.check(rows == vec![expected.clone()], || {
                    format!("{what}: placed {expected:?}, the database has {rows:?}")
                });
                verdict.check(json!(units) == body["unitIds"], || {
                    format!(
                        "{what}: placed on {}, the database has {units:?}",
                        body["unitIds"]
                    )
                });
                let request: Value =
                    serde_json::from_str(record.request.body.as_deref().unwrap_or("null")).unwrap();
                verdict.check(
                    body["unitIds"] == request["unitIds"]
                        && body["tier"] == request["tier"]
                        && body["nodeId"] == request["nodeId"],
                    || format!("{what}: asked for {request}, got {body}"),
                );
                // The id is the server's, and the one the request's audit event names.
                let event = by_request.get(record.request_id.as_str());
                verdict.check(
                    id.starts_with("vm-") && event.is_some_and(|e| e.vm_id.as_deref() == Some(id)),
                    || format!("{what}: answered VM {id}, its audit event is {event:?}"),
                );
            }
            Kind::Terminate => {
                let id = body["id"].as_str().unwrap_or_default();
                let row: (String, Option<String>) = db
                    .query_row(
                        "SELECT status, termination_reason FROM vms WHERE id = ?",
                        [id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .unwrap();
                verdict.check(
                    row.0 == "terminated" && row.1.as_deref() == body["terminationReason"].as_str(),
                    || format!("{what}: answered {body}, the database has {row:?}"),
                );
                verdict.check(
                    model
                        .vms
                        .get(id)
                        .is_some_and(|vm| !vm.running && !vm.reclaimed),
                    || {
                        format!(
                            "{what}: the history does not show {id} stopped by this termination"
                        )
                    },
                );
            }
            _ => {}
        }
    }
}

/// The database agrees with the replayed history, and its own invariants hold.
fn check_database(db: &rusqlite::Connection, model: &Model, verdict: &mut Verdict) {
    let strings = |sql: &str| -> Vec<String> {
        db.prepare(sql)
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let doubly_used = strings(
        "SELECT node_id || '/' || unit_id FROM vm_units WHERE running = 1 \
         GROUP BY node_id, unit_id HAVING count(*) > 1",
    );
    verdict.check(doubly_used.is_empty(), || {
        format!("units running more than one VM: {doubly_used:?}")
    });
    let now = chrono::Utc::now().timestamp_millis();
    let non_spot_on_released = strings(&format!(
        "SELECT vu.vm_id FROM vm_units vu \
         JOIN reservation_units ru ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
         JOIN reservations r ON r.id = ru.reservation_id \
         WHERE vu.running = 1 AND vu.tier <> 'spot' AND ru.released = 1 AND r.state = 'live' \
           AND r.starts_at <= {now} AND (r.ends_at IS NULL OR r.ends_at > {now})"
    ));
    verdict.check(non_spot_on_released.is_empty(), || {
        format!("community/verified VMs on released units: {non_spot_on_released:?}")
    });
    let inconsistent = strings(
        "SELECT v.id FROM vms v WHERE \
         (v.status = 'running') <> EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id AND vu.running = 1) \
         OR NOT EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id) \
         OR EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id AND vu.running = 0) AND v.status = 'running' \
         OR (v.status = 'running') <> (v.termination_reason IS NULL AND v.terminated_at IS NULL)",
    );
    verdict.check(inconsistent.is_empty(), || {
        format!("VMs whose rows disagree with each other: {inconsistent:?}")
    });
    let journal: String = db
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    verdict.check(journal == "wal", || format!("journal mode is {journal}"));

    // The database is exactly the replayed history.
    for (id, r) in &model.reservations {
        let (state, units, released) = reservation_state(db, id);
        verdict.check(state == r.state, || {
            format!("{id}: state {state}, history says {}", r.state)
        });
        verdict.check(units == r.units, || {
            format!("{id}: units {units:?}, history says {:?}", r.units)
        });
        verdict.check(released == r.released, || {
            format!("{id}: released {released:?}, history says {:?}", r.released)
        });
    }
    for (id, vm) in &model.vms {
        let (status, reason): (String, Option<String>) = db
            .query_row(
                "SELECT status, termination_reason FROM vms WHERE id = ?",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        verdict.check((status == "running") == vm.running, || {
            format!("{id}: {status}, history says running={}", vm.running)
        });
        verdict.check(
            (reason.as_deref() == Some("reclaimed")) == vm.reclaimed,
            || {
                format!(
                    "{id}: reason {reason:?}, history says reclaimed={}",
                    vm.reclaimed
                )
            },
        );
    }
    let vm_count: i64 = db
        .query_row("SELECT count(*) FROM vms", [], |r| r.get(0))
        .unwrap();
    verdict.check(vm_count as usize == model.vms.len(), || {
        format!(
            "{vm_count} VMs stored, {} placed according to the audit trail",
            model.vms.len()
        )
    });
    for (node, units) in &model.nodes {
        let stored: BTreeSet<String> = db
            .prepare("SELECT unit_id FROM node_units WHERE node_id = ?")
            .unwrap()
            .query_map([node], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        verdict.check(&stored == units, || {
            format!("{node}: units {stored:?}, history says {units:?}")
        });
    }
}

/// A reservation's stored state, units and released units.
pub fn reservation_state(
    db: &rusqlite::Connection,
    id: &str,
) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let state: String = db
        .query_row("SELECT state FROM reservations WHERE id = ?", [id], |r| {
            r.get(0)
        })
        .unwrap();
    let mut units = BTreeSet::new();
    let mut released = BTreeSet::new();
    let mut statement = db
        .prepare("SELECT unit_id, released FROM reservation_units WHERE reservation_id = ?")
        .unwrap();
    let rows = statement
        .query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))
        .unwrap();
    for row in rows {
        let (unit, is_released) = row.unwrap();
        if is_released {
            released.insert(unit.clone());
        }
        units.insert(unit);
    }
    (state, units, released)
}
