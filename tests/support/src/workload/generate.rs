//! The workload's operations: chosen at random, sent by many threads at once, each request
//! recorded with the logical times of its sending and its answer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use api_client::Client;
use serde_json::{Value, json};

use crate::answers::asks_for_retry;
use crate::random::Rng;

use super::market::{
    AUDIENCE, Actor, EXTRA_UNIT, Market, NODE_UNITS, OUTSIDERS, RESERVED_UNITS, TIERS,
};
use super::model::string_items;

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
    pub(crate) fn mutates(self) -> bool {
        !matches!(
            self,
            Kind::DryRun | Kind::CapacityWithoutPermission | Kind::Replay | Kind::Duplicate
        )
    }

    pub(crate) fn audit_action(self) -> &'static str {
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
    pub(crate) fn allowed_statuses(self) -> &'static [u16] {
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

pub(crate) const WEIGHTS: [(Kind, usize); 10] = [
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
    /// The id the request is at home by (docs/design.md, "Cells"): the node its path names,
    /// the VM its path names (a VM's id names its node's cell), or for a placement the node
    /// its body names.
    pub fn home(&self) -> String {
        let mut segments = self.request.path.trim_start_matches('/').split('/').skip(1);
        match (segments.next(), segments.next()) {
            (Some("nodes" | "vms"), Some(id)) => id.to_owned(),
            _ => self
                .request
                .body
                .as_deref()
                .and_then(|body| serde_json::from_str::<serde_json::Value>(body).ok())
                .and_then(|body| body["nodeId"].as_str().map(str::to_owned))
                .unwrap_or_default(),
        }
    }

    /// `request` sent once as `request_id` to `base`, with what came back: neither a replay
    /// nor a twin.
    fn sent(kind: Kind, request: Request, request_id: String, base: &str, timed: Timed) -> Record {
        let ((status, content_type, body, replayed), sent_at, answered_at, retried) = timed;
        Record {
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
        }
    }

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
pub(crate) struct Shared {
    pub(crate) placed: Mutex<Vec<(String, String)>>,
    pub(crate) running: Mutex<Vec<(String, String)>>,
    pub(crate) clock: AtomicU64,
}

impl Shared {
    /// Follows what an answer did to the set of running VMs: a placement adds one, a
    /// termination or a reclaim stops some.
    pub(crate) fn note(&self, record: &Record) {
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
    pub(crate) fn termination_target(&self, rng: &mut Rng) -> Option<(String, String)> {
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
pub(crate) type Timed = ((u16, Option<String>, Vec<u8>, bool), u64, u64, u32);

/// How many times a client sends a request again when the answer asks it to.
pub(crate) const RETRIES: u32 = 6;

/// Sends `request`, and again, as the contract tells a client to, while the answer is a 503
/// that changed nothing and asks for a retry (`database-busy`, `write-contention`): on a
/// loaded machine the shared database's lock can stay taken past the app's own retries.
/// The effect, if any, falls between the first send and the last answer.
pub(crate) fn timed_send(
    shared: &Shared,
    base: &str,
    request: &Request,
    request_id: &str,
) -> Timed {
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

pub(crate) fn choose_kind(rng: &mut Rng) -> Kind {
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
pub(crate) fn one_operation(
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
        let timed = timed_send(shared, base, &original.request, &request_id);
        return vec![Record {
            replay_of: Some(original.request_id.clone()),
            ..Record::sent(kind, original.request.clone(), request_id, base, timed)
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
            .map(|(i, (id, base, timed))| {
                let kind = if i == 0 { inner } else { Kind::Replay };
                Record {
                    replay_of: (i == 1).then(|| original_id.clone()),
                    twin: true,
                    ..Record::sent(kind, request.clone(), id, &base, timed)
                }
            })
            .collect();
    }
    let request = build_request(market, shared, rng, kind, &request_id);
    let timed = timed_send(shared, base, &request, &request_id);
    vec![Record::sent(kind, request, request_id, base, timed)]
}

pub(crate) fn build_request(
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
