//! Faults of a shared deployment: three `spin-host` processes on one sqld and one Redis
//! while sqld is killed and restarted in the middle of the traffic, sqld stalls (SIGSTOP)
//! until a liveness probe like deploy/sqld.yaml's restarts it, and a replica is SIGKILLed
//! while it serves a request (a fresh replica takes its place, as an orchestrator would
//! start one).
//!
//! Clients send releases, reclaims and spot or community placements, each with its own
//! `Idempotency-Key`, to any live replica; an answer that never arrives, or a 5xx, is sent
//! again with the same key and body (to whichever replica is up) until a final answer comes.
//! The faults must hit: each sqld restart keeps sqld down until a client has been answered 503
//! for it, and replicas are killed until a kill has lost the answer of a request in flight
//! (which its client then sends again). Then:
//! - every answer that arrived is a success (JSON) or a problem document, and a 503 carries
//!   `Retry-After`;
//! - exactly once: a request whose final answer is a success left exactly one audit event
//!   among all of its attempts (a placement's event names the VM the answer names), and one
//!   whose final answer is a refusal left none;
//! - nothing half-applied, and the audit trail replays to the database: a healthy workload
//!   runs after the faults, and its verdict, which replays every event since the market was
//!   set up against the rows in sqld and verifies the chain, must be clean.
//!
//! Scale: `FAULT_OPERATIONS` (requests per client at least; the clients go on until the
//! faults are over), `FAULT_ROUNDS` (rounds of one sqld restart, one stall and one replica
//! kill), `FAULT_SEED`; `LIVENESS_PERIOD_S=10` probes a stalled sqld as deploy/sqld.yaml does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::replicas::Replica;
use api_support::random::{Rng, scale, seed};
use api_support::stores::RemoteStores;
use api_support::workload::{
    AUDIENCE, Actor, Market, NODES, OUTSIDERS, RESERVED_UNITS, last_seq, run, trail_marks,
    verify_run,
};
use api_support::{App, TempDir};

const REPLICAS: usize = 3;
const CLIENTS: usize = 6;
/// Requests per client in CI, at least.
const OPERATIONS_PER_CLIENT: usize = 12;
/// Rounds of faults in CI: each restarts sqld once, stalls it once and kills one replica.
const ROUNDS: usize = 1;
/// The liveness probe's period and time to answer in CI (deploy/sqld.yaml: 10 s each).
const LIVENESS_PERIOD_S: usize = 2;
/// Failed probes in a row before sqld is restarted, as deploy/sqld.yaml's `failureThreshold`.
const LIVENESS_FAILURES: usize = 3;
/// A request is given up (and the test fails) if no final answer comes by then.
const PATIENCE: Duration = Duration::from_secs(90);
/// The healthy workload after the faults.
const AFTER_THREADS: usize = 6;
const AFTER_OPERATIONS_PER_THREAD: usize = 20;

/// One request, sent again byte for byte until a final answer.
struct Operation {
    key: String,
    path: String,
    body: Value,
    token: String,
    /// The audit action a success leaves.
    action: &'static str,
}

/// An answer that arrived: status, content type, `Retry-After`, body, replayed.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    retry_after: Option<String>,
    body: Value,
    replayed: bool,
}

/// What happened to one operation.
struct Outcome {
    operation: Operation,
    /// Every attempt's request id, and its answer (`Err`: none arrived).
    attempts: Vec<(String, Result<Answer, String>)>,
    final_answer: Option<Answer>,
}

/// The live replicas' bases, the requests each has in flight, and what became of answers.
struct Fleet {
    bases: RwLock<Vec<String>>,
    in_flight: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Requests whose answer never arrived.
    lost: Mutex<BTreeSet<String>>,
    /// Answers 503 `storage-unavailable` so far.
    unavailable: AtomicUsize,
    /// Successes so far.
    succeeded: AtomicUsize,
}

impl Fleet {
    fn new(bases: Vec<String>) -> Fleet {
        Fleet {
            bases: RwLock::new(bases),
            in_flight: Mutex::new(BTreeMap::new()),
            lost: Mutex::new(BTreeSet::new()),
            unavailable: AtomicUsize::new(0),
            succeeded: AtomicUsize::new(0),
        }
    }

    fn pick(&self, rng: &mut Rng) -> String {
        let bases = self.bases.read().unwrap();
        rng.pick(&bases).clone()
    }

    /// Sends `request_id` to `base`, unless the replica has left the fleet meanwhile: a
    /// request is in flight at a replica from here until [`Fleet::leave`].
    fn enter(&self, base: &str, request_id: &str) -> bool {
        let bases = self.bases.read().unwrap();
        if !bases.iter().any(|b| b == base) {
            return false;
        }
        self.in_flight
            .lock()
            .unwrap()
            .entry(base.to_owned())
            .or_default()
            .insert(request_id.to_owned());
        true
    }

    fn leave(&self, base: &str, request_id: &str, answer: &Result<Answer, String>) {
        match answer {
            Err(_) => {
                self.lost.lock().unwrap().insert(request_id.to_owned());
            }
            Ok(answer) if answer.status == 503 && answer.body["code"] == "storage-unavailable" => {
                self.unavailable.fetch_add(1, Ordering::SeqCst);
            }
            Ok(answer) if (200..300).contains(&answer.status) => {
                self.succeeded.fetch_add(1, Ordering::SeqCst);
            }
            Ok(_) => {}
        }
        if let Some(requests) = self.in_flight.lock().unwrap().get_mut(base) {
            requests.remove(request_id);
        }
    }

    fn in_flight_at(&self, base: &str) -> BTreeSet<String> {
        self.in_flight
            .lock()
            .unwrap()
            .get(base)
            .cloned()
            .unwrap_or_default()
    }

    /// Takes `base` out of the fleet: no request is sent to it from now on. The requests in
    /// flight at it.
    fn remove(&self, base: &str) -> BTreeSet<String> {
        let mut bases = self.bases.write().unwrap();
        bases.retain(|b| b != base);
        self.in_flight_at(base)
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn send(
    agent: &ureq::Agent,
    base: &str,
    operation: &Operation,
    request_id: &str,
) -> Result<Answer, String> {
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("{base}{}", operation.path))
        .header("authorization", format!("Bearer {}", operation.token))
        .header("content-type", "application/json")
        .header("idempotency-key", &operation.key)
        .header("x-request-id", request_id)
        .body(operation.body.to_string().into_bytes())
        .expect("request");
    let mut response = agent.run(request).map_err(|e| e.to_string())?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let retry_after = header("retry-after");
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    Ok(Answer {
        status,
        content_type,
        retry_after,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        replayed,
    })
}

/// A release, reclaim or placement on the market, with a fresh key.
fn operation(market: &Market, rng: &mut Rng, key: String) -> Operation {
    let node = rng.below(NODES.len());
    let (node_id, reservation) = &market.reservations[node];
    let roll = rng.below(100);
    if roll < 60 {
        let (change, action, reason, actor) = if roll < 35 {
            ("release", "reservation.release", "idle", Actor::Broker)
        } else {
            ("reclaim", "reservation.reclaim", "needed", Actor::Owner)
        };
        Operation {
            key,
            path: format!("/v1/nodes/{node_id}/reservations/{reservation}/{change}"),
            body: json!({ "unitIds": rng.subset(&RESERVED_UNITS, 1, 2), "reason": reason }),
            token: market.token(&actor),
            action,
        }
    } else {
        let spot = rng.chance(60);
        let org = if spot {
            rng.pick(&OUTSIDERS)
        } else {
            rng.pick(&AUDIENCE)
        };
        Operation {
            key,
            path: "/v1/vms".to_owned(),
            body: json!({
                "nodeId": node_id,
                "unitIds": [rng.pick(&RESERVED_UNITS)],
                "tier": if spot { "spot" } else { "community" },
            }),
            token: market.token(&Actor::Member((*org).to_owned())),
            action: "vm.place",
        }
    }
}

/// Sends `operation` until a final answer (not 5xx) arrives or [`PATIENCE`] runs out.
fn until_final(fleet: &Fleet, rng: &mut Rng, operation: Operation) -> Outcome {
    let agent = agent();
    let started = Instant::now();
    let mut attempts = Vec::new();
    let mut final_answer = None;
    while started.elapsed() < PATIENCE {
        let base = fleet.pick(rng);
        let request_id = format!("{}-a{}", operation.key, attempts.len());
        if !fleet.enter(&base, &request_id) {
            continue;
        }
        let answer = send(&agent, &base, &operation, &request_id);
        fleet.leave(&base, &request_id, &answer);
        attempts.push((request_id, answer.clone()));
        match answer {
            Ok(answer) if answer.status < 500 => {
                final_answer = Some(answer);
                break;
            }
            // Retry-After is in seconds; the test waits less, as an impatient client would.
            _ => std::thread::sleep(Duration::from_millis(50 + rng.below(100) as u64)),
        }
    }
    Outcome {
        operation,
        attempts,
        final_answer,
    }
}

/// What the fault thread did.
#[derive(Debug, Default)]
struct Faults {
    sqld_restarts: usize,
    /// From each stall to the first write answered after its restart.
    stall_outages: Vec<Duration>,
    replica_kills: usize,
    /// Kills that lost the answer of a request in flight.
    kills_mid_request: usize,
    /// The requests whose answers those kills lost.
    lost_to_kills: BTreeSet<String>,
}

/// How many replicas are killed at most, per round, for one to lose a request's answer.
const KILLS_PER_ROUND: usize = 20;

/// What a client thread shares with the others.
struct Traffic<'a> {
    market: &'a Market,
    fleet: &'a Fleet,
    faults_over: &'a AtomicBool,
    sent: &'a AtomicUsize,
}

impl Traffic<'_> {
    /// Sends operations until it has sent `per_client` and the faults are over.
    fn client(&self, client: usize, mut rng: Rng, per_client: usize) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        let mut n = 0;
        while n < per_client || !self.faults_over.load(Ordering::SeqCst) {
            let key = format!("fault-{client}-{n}");
            let operation = operation(self.market, &mut rng, key);
            outcomes.push(until_final(self.fleet, &mut rng, operation));
            self.sent.fetch_add(1, Ordering::SeqCst);
            n += 1;
        }
        outcomes
    }
}

/// Restarts sqld, stalls it until its liveness probe restarts it, and SIGKILLs a replica (a
/// busy one when it can) `rounds` times, each after some traffic, starting a fresh replica in
/// the killed one's place.
fn inject_faults(
    stores: &Mutex<RemoteStores>,
    replicas: &mut Vec<Replica>,
    fleet: &Fleet,
    sent: &AtomicUsize,
    rounds: usize,
    mut rng: Rng,
) -> Faults {
    let mut faults = Faults::default();
    let wait_for_traffic = |count: usize| {
        api_support::until(
            &format!("the clients have sent {count} requests"),
            Duration::from_secs(120),
            || sent.load(Ordering::SeqCst) >= count,
        );
    };
    for round in 0..rounds {
        wait_for_traffic((round * 3 + 1) * CLIENTS);
        // sqld goes away in the middle of transactions and comes back on the same
        // data: every replica must reconnect, nothing half-written may stay. It stays away
        // until a client has been answered 503 for it.
        {
            let mut stores = stores.lock().unwrap();
            let unavailable = fleet.unavailable.load(Ordering::SeqCst);
            stores.sqld.kill();
            let deadline = Instant::now() + Duration::from_secs(30);
            while fleet.unavailable.load(Ordering::SeqCst) == unavailable {
                assert!(
                    Instant::now() < deadline,
                    "no client was answered 503 while sqld was down"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.below(400) as u64));
            stores.sqld.start_again();
            faults.sqld_restarts += 1;
        }
        wait_for_traffic((round * 3 + 2) * CLIENTS);
        faults
            .stall_outages
            .push(stall_until_restarted(stores, fleet));
        wait_for_traffic((round * 3 + 3) * CLIENTS);
        // SIGKILL a replica while it serves a request, a fresh one taking its place, until a
        // kill has lost the answer of a request in flight.
        let mut kills = 0;
        loop {
            assert!(
                kills < KILLS_PER_ROUND,
                "{kills} kills, none lost a request's answer"
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            let victim = loop {
                let busy = replicas
                    .iter()
                    .position(|r| !fleet.in_flight_at(&r.base).is_empty());
                match busy {
                    Some(index) => break index,
                    None => {
                        assert!(Instant::now() < deadline, "no replica served a request");
                        std::thread::yield_now();
                    }
                }
            };
            let killed = replicas.remove(victim);
            let killed_base = killed.base.clone();
            let in_flight = fleet.remove(&killed_base);
            killed.kill();
            kills += 1;
            faults.replica_kills += 1;
            let fresh = Replica::start(&stores.lock().unwrap());
            fleet.bases.write().unwrap().push(fresh.base.clone());
            replicas.push(fresh);
            // Its clients hear of the kill (no answer) or had their answer just before it.
            let deadline = Instant::now() + Duration::from_secs(90);
            while !fleet.in_flight_at(&killed_base).is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "requests to a killed replica never returned"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let lost: BTreeSet<String> = fleet
                .lost
                .lock()
                .unwrap()
                .intersection(&in_flight)
                .cloned()
                .collect();
            if !lost.is_empty() {
                faults.kills_mid_request += 1;
                faults.lost_to_kills.extend(lost);
                break;
            }
        }
    }
    faults
}

/// sqld stalls under the traffic (SIGSTOP: it keeps its sockets and answers nothing) and a
/// liveness probe like deploy/sqld.yaml's restarts it after [`LIVENESS_FAILURES`] failures in
/// a row. How long writes were out: from the stall to the first write answered after it.
fn stall_until_restarted(stores: &Mutex<RemoteStores>, fleet: &Fleet) -> Duration {
    let period = Duration::from_secs(scale("LIVENESS_PERIOD_S", LIVENESS_PERIOD_S) as u64);
    let stalled_at = Instant::now();
    stores.lock().unwrap().sqld.stall();
    for _ in 0..LIVENESS_FAILURES {
        let probed = Instant::now();
        assert!(
            !stores
                .lock()
                .unwrap()
                .sqld
                .passes_its_manifest_liveness_probe(period),
            "a stalled sqld passed deploy/sqld.yaml's liveness probe"
        );
        std::thread::sleep(period.saturating_sub(probed.elapsed()));
    }
    let succeeded = fleet.succeeded.load(Ordering::SeqCst);
    {
        let mut stores = stores.lock().unwrap();
        stores.sqld.kill();
        stores.sqld.start_again();
    }
    // The control: the same probe passes once sqld is back.
    api_support::until(
        "the restarted sqld passes its liveness probe",
        PATIENCE,
        || {
            stores
                .lock()
                .unwrap()
                .sqld
                .passes_its_manifest_liveness_probe(period)
        },
    );
    api_support::until(
        "a write answered after the stalled sqld's restart",
        PATIENCE,
        || fleet.succeeded.load(Ordering::SeqCst) > succeeded,
    );
    stalled_at.elapsed()
}

/// The audit events since `setup_seq` as (action, VM) by the request id they carry (the
/// client's, when it sent one); no two may carry one.
fn events_by_request(
    db: &rusqlite::Connection,
    setup_seq: i64,
) -> BTreeMap<String, (String, Option<String>)> {
    let mut events_by_request: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    let mut statement = db
        .prepare(
            "SELECT coalesce(client_request_id, request_id), action, vm_id FROM audit_events \
             WHERE seq > ?1",
        )
        .unwrap();
    let rows = statement
        .query_map([setup_seq], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap();
    for row in rows {
        let (request_id, event): (String, (String, Option<String>)) = row.unwrap();
        let previous = events_by_request.insert(request_id.clone(), event);
        assert!(
            previous.is_none(),
            "two events carry request id {request_id}"
        );
    }
    events_by_request
}

/// Every answer is a success with a JSON body or a problem document, and a 503 says when to
/// retry.
fn check_answer(request_id: &str, answer: &Answer, failures: &mut Vec<String>) {
    let success = (200..300).contains(&answer.status);
    let problem = answer.content_type.as_deref() == Some("application/problem+json")
        && answer.body["status"] == answer.status
        && answer.body["code"].is_string();
    if success && !answer.body.is_object() {
        failures.push(format!(
            "{request_id}: a {} without a JSON body",
            answer.status
        ));
    }
    if !success && !problem {
        failures.push(format!(
            "{request_id}: a {} that is not a problem document: {}",
            answer.status, answer.body
        ));
    }
    if answer.status == 503 && answer.retry_after.is_none() {
        failures.push(format!("{request_id}: a 503 without Retry-After"));
    }
}

/// An operation whose last answer is a success left exactly its one audit event (for a
/// placement, of the VM it answered), and one refused left none, whatever its attempts.
fn check_effect(
    outcome: &Outcome,
    last: &Answer,
    events_by_request: &BTreeMap<String, (String, Option<String>)>,
    failures: &mut Vec<String>,
) {
    let key = &outcome.operation.key;
    let events: Vec<&(String, Option<String>)> = outcome
        .attempts
        .iter()
        .filter_map(|(request_id, _)| events_by_request.get(request_id))
        .collect();
    let success = (200..300).contains(&last.status);
    if success {
        if events.len() != 1 {
            failures.push(format!(
                "{key}: answered {} but left {} audit events",
                last.status,
                events.len()
            ));
        } else if events[0].0 != outcome.operation.action {
            failures.push(format!("{key}: left a {} event", events[0].0));
        } else if outcome.operation.action == "vm.place"
            && events[0].1.as_deref() != last.body["id"].as_str()
        {
            failures.push(format!(
                "{key}: answered VM {} but placed {:?}",
                last.body["id"], events[0].1
            ));
        }
    } else if !events.is_empty() {
        failures.push(format!(
            "{key}: answered {} {} yet left {} audit events",
            last.status,
            last.body["code"],
            events.len()
        ));
    }
}

#[test]
fn sqld_restarts_and_killed_replicas_lose_nothing() {
    let _machine = api_support::machine_to_itself();
    let seed = seed("FAULT_SEED");
    let rounds = scale("FAULT_ROUNDS", ROUNDS);
    let per_client = scale("FAULT_OPERATIONS", CLIENTS * OPERATIONS_PER_CLIENT).div_ceil(CLIENTS);
    let dir = TempDir::new("fault-stores");
    let stores = Mutex::new(RemoteStores::start(dir.path()));
    let runtime_stores = stores.lock().unwrap();
    let app = App::start_on(&runtime_stores);
    let mut replicas: Vec<Replica> = (0..REPLICAS)
        .map(|_| Replica::start(&runtime_stores))
        .collect();
    drop(runtime_stores);
    let market = Market::setup(&app);
    let setup_seq = last_seq(&app.db());
    let fleet = Fleet::new(replicas.iter().map(|r| r.base.clone()).collect());
    let faults_over = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);

    let (outcomes, faults) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let (fleet, market, faults_over, sent) = (&fleet, &market, &faults_over, &sent);
                scope.spawn(move || {
                    let rng =
                        Rng::new(seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let traffic = Traffic {
                        market,
                        fleet,
                        faults_over,
                        sent,
                    };
                    traffic.client(client, rng, per_client)
                })
            })
            .collect();
        let faulting = scope.spawn(|| {
            // The clients stop once the faults are over, even if this thread panics.
            struct Over<'a>(&'a AtomicBool);
            impl Drop for Over<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _over = Over(&faults_over);
            let rng = Rng::new(seed ^ 0xFA17);
            inject_faults(&stores, &mut replicas, &fleet, &sent, rounds, rng)
        });
        let faults = faulting.join().expect("the fault thread panicked");
        let outcomes: Vec<Outcome> = clients
            .into_iter()
            .flat_map(|c| c.join().expect("a client panicked"))
            .collect();
        (outcomes, faults)
    });

    let events_by_request = events_by_request(&app.db(), setup_seq);

    let mut failures = Vec::new();
    let (mut lost, mut retried, mut by_status) = (0, 0, BTreeMap::<u16, usize>::new());
    for outcome in &outcomes {
        let key = &outcome.operation.key;
        retried += outcome.attempts.len() - 1;
        for (request_id, answer) in &outcome.attempts {
            let answer = match answer {
                Ok(answer) => answer,
                Err(_) => {
                    lost += 1;
                    continue;
                }
            };
            *by_status.entry(answer.status).or_default() += 1;
            check_answer(request_id, answer, &mut failures);
        }
        let Some(last) = &outcome.final_answer else {
            failures.push(format!("{key}: no final answer within {PATIENCE:?}"));
            continue;
        };
        check_effect(outcome, last, &events_by_request, &mut failures);
    }
    let replays = outcomes
        .iter()
        .flat_map(|outcome| &outcome.attempts)
        .filter(|(_, answer)| answer.as_ref().is_ok_and(|answer| answer.replayed))
        .count();
    println!(
        "faults: {} sqld restarts, {} stalls restarted by the liveness probe (writes out for {:?}), \
         {} replica kills ({} in the middle of a request); {} operations, {} retries ({replays} \
         answered as replays), {} answers lost; answers by status {by_status:?}",
        faults.sqld_restarts,
        faults.stall_outages.len(),
        faults.stall_outages,
        faults.replica_kills,
        faults.kills_mid_request,
        outcomes.len(),
        retried,
        lost
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(faults.sqld_restarts, rounds);
    assert_eq!(faults.stall_outages.len(), rounds);
    // The faults hit: each restart was answered 503 (checked as it ran), each round's kill
    // lost the answer of a request in flight, and that request was sent again until it had a
    // final answer whose effect is checked above.
    assert_eq!(faults.kills_mid_request, rounds, "{faults:?}");
    assert!(
        fleet.unavailable.load(Ordering::SeqCst) >= rounds,
        "answers by status {by_status:?}"
    );
    for request_id in &faults.lost_to_kills {
        let outcome = outcomes
            .iter()
            .find(|o| o.attempts.iter().any(|(id, _)| id == request_id))
            .expect("the lost request's operation");
        let position = outcome
            .attempts
            .iter()
            .position(|(id, _)| id == request_id)
            .expect("the lost attempt");
        assert!(
            outcome.attempts[position].1.is_err() && outcome.attempts.len() > position + 1,
            "{request_id}: its answer was lost, yet it was not sent again"
        );
        assert!(outcome.final_answer.is_some(), "{request_id}");
    }
    assert!(
        lost >= rounds && retried >= lost,
        "{lost} lost, {retried} retried"
    );

    // After the faults: a healthy workload on the replicas left, and every invariant over
    // the whole history since the setup.
    let bases = fleet.bases.read().unwrap().clone();
    let after = trail_marks(&app);
    let records = run(
        &market,
        &bases,
        AFTER_THREADS,
        AFTER_OPERATIONS_PER_THREAD,
        seed,
    );
    verify_run(
        &app,
        &records,
        &after,
        &format!("after the faults, seed {seed}"),
    );
    drop(replicas);
}
