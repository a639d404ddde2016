//! Faults: the `spin-host` binary is killed (SIGKILL) in the middle of streams of releases,
//! spot placements and reclaims, restarted on the same state directory (on another port),
//! and every request whose answer never arrived is sent again with the same
//! `Idempotency-Key` and body. While the host runs, some answers are lost on purpose too (the
//! client gives up after a few milliseconds) and the request is sent again at once, while its
//! first attempt may still be running.
//!
//! Each stream works on its own reservation, so its expected state after every step is
//! known. VM ids are the server's: the model names the VM of a placement step after its
//! `Idempotency-Key`, and the audit trail (whose `vm.place` event carries the attempt's
//! request id) says which stored VM each step created, so "at most once" stays exact. While the host is down, the database must hold, for every interrupted request,
//! either all of its effects (its audit event, its units, its VMs) or none of them. After the
//! retries and the rest of the streams, the state must be exactly what a run without the
//! crash gives, the audit chain must verify and no row may be half-written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use api_support::app::local_cell_files;
use api_support::positions::cells_under_test;
use api_support::random::{Rng, scale, seed};
use api_support::workload::reservation_state;
use api_support::{
    Client, HostProcess, OPERATOR_TOKEN, TempDir, ensure_components_built, rfc3339_from_now,
};
use reservations_store::cells::Cells;

const STREAMS: usize = 4;
const UNITS_PER_STREAM: usize = 4;
/// Kills in CI; `CRASH_KILLS=<n>` for a soak run (50). The run kills again (up to
/// `EXTRA_KILLS` more times) until at least one kill has interrupted a request and at least
/// one has interrupted a request that had committed, so that the all-or-nothing and
/// exactly-once checks below never check nothing.
const CRASHES: usize = 2;
const EXTRA_KILLS: usize = 30;
const NODE: &str = "n0";
/// How long a client waits for an answer it means to get.
const PATIENCE: Duration = Duration::from_secs(60);

/// The `spin-host` binary serving `state` on a free port, its log appended to `host.log`.
fn start_host(state: &Path) -> HostProcess {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("host.log"))
        .expect("host log");
    let cells = api_support::app::local_cells_host_args(state);
    let args: Vec<&std::ffi::OsStr> = cells.iter().map(|arg| arg.as_os_str()).collect();
    HostProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_spin-host")),
        state,
        log,
        &args,
    )
}

/// The database that holds the node and everything the streams write: its cell's, with the
/// market in `TEST_CELLS` cells.
fn node_database(state: &Path) -> std::path::PathBuf {
    let cells = Cells::new(cells_under_test()).expect("cells under test");
    local_cell_files(state, cells.count()).swap_remove(cells.home_of(NODE).index())
}

/// An HTTP answer, or why none arrived (the host died, the client gave up…).
type Answer = Result<(u16, bool, Value), String>;

/// Sends a step's request under `request_id`, with the step's `Idempotency-Key`.
fn send(client: &Client, step: &Step, request_id: &str) -> Answer {
    let reply = client
        .with_header("idempotency-key", &step.key)
        .with_header("x-request-id", request_id)
        .try_send(
            "POST",
            &step.path,
            Some("application/json"),
            Some(step.body.to_string().as_bytes()),
        )?;
    Ok((
        reply.status,
        reply.header("idempotent-replayed") == Some("true"),
        serde_json::from_slice(&reply.body).unwrap_or(Value::Null),
    ))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Action {
    Release,
    Reclaim,
    PlaceSpot,
}

/// One request of a stream, and what it answers when it runs at its place in the stream.
#[derive(Debug, Clone)]
struct Step {
    action: Action,
    key: String,
    path: String,
    body: Value,
    expected_status: u16,
    /// The released set after it.
    released_after: BTreeSet<String>,
    /// Reclaim: the VMs it terminates.
    terminates: Vec<String>,
    /// The client gives up on the first attempt's answer after this long.
    lose_first_answer_after: Option<Duration>,
}

/// A stream's state: its reservation's released units, and its VMs.
#[derive(Debug, Clone, Default, PartialEq)]
struct StreamState {
    released: BTreeSet<String>,
    /// unit -> running VM
    running: BTreeMap<String, String>,
    /// VM id -> running?
    vms: BTreeMap<String, bool>,
}

struct Stream {
    reservation: String,
    steps: Vec<Step>,
    /// `states[k]` is the state before step `k`; `states[steps.len()]` the final one.
    states: Vec<StreamState>,
}

fn plan_stream(
    index: usize,
    reservation: String,
    units: &[String],
    steps_per_stream: usize,
    rng: &mut Rng,
) -> Stream {
    let unit_refs: Vec<&str> = units.iter().map(String::as_str).collect();
    let mut state = StreamState::default();
    let mut states = vec![state.clone()];
    let mut steps = Vec::new();
    for k in 0..steps_per_stream {
        let roll = rng.below(100);
        let action = match roll {
            0..35 => Action::Release,
            35..65 => Action::Reclaim,
            _ => Action::PlaceSpot,
        };
        let mut terminates = Vec::new();
        let (path, body, expected_status) = match action {
            Action::Release | Action::Reclaim => {
                let chosen = rng.subset(&unit_refs, 1, 3);
                let verb = if action == Action::Release {
                    state.released.extend(chosen.iter().cloned());
                    "release"
                } else {
                    for unit in &chosen {
                        state.released.remove(unit);
                        if let Some(vm) = state.running.remove(unit) {
                            state.vms.insert(vm.clone(), false);
                            terminates.push(vm);
                        }
                    }
                    terminates.sort();
                    "reclaim"
                };
                (
                    format!("/v1/nodes/{NODE}/reservations/{reservation}/{verb}"),
                    json!({ "unitIds": chosen, "reason": format!("stream {index} step {k}") }),
                    200,
                )
            }
            Action::PlaceSpot => {
                let unit = rng.pick(units).clone();
                let vm_id = vm_name(&format!("crash-{index}-{k}"));
                // An outsider's spot VM goes on a released unit that is free, nowhere else.
                let placeable =
                    state.released.contains(&unit) && !state.running.contains_key(&unit);
                if placeable {
                    state.running.insert(unit.clone(), vm_id.clone());
                    state.vms.insert(vm_id.clone(), true);
                }
                (
                    "/v1/vms".to_owned(),
                    json!({ "nodeId": NODE, "unitIds": [unit], "tier": "spot" }),
                    if placeable { 201 } else { 409 },
                )
            }
        };
        let lose_first_answer_after = rng
            .chance(10)
            .then(|| Duration::from_millis(1 + rng.below(12) as u64));
        steps.push(Step {
            action,
            key: step_key(index, k),
            path,
            body,
            expected_status,
            released_after: state.released.clone(),
            terminates,
            lose_first_answer_after,
        });
        states.push(state.clone());
    }
    Stream {
        reservation,
        steps,
        states,
    }
}

fn step_key(index: usize, k: usize) -> String {
    format!("crash-{index}-{k}")
}

/// The model's name for the VM that the placement step with this key creates.
fn vm_name(key: &str) -> String {
    key.replacen("crash-", "vm-", 1)
}

/// How far a stream got: the next step to send, and whether that step was sent without an
/// answer (it must be sent again with the same key).
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    next: usize,
    unanswered: bool,
    attempts: usize,
}

/// What the run saw, for the checks and the report.
#[derive(Default)]
struct Tally {
    /// Set just before the host is killed: from then on a missing answer stops the stream.
    killed: AtomicBool,
    sent: AtomicUsize,
    answered: AtomicUsize,
    replayed: AtomicUsize,
    /// Answers the client gave up on while the host ran.
    lost_while_running: AtomicUsize,
    /// Retried steps answered as replays: (stream, step).
    replayed_retries: Mutex<BTreeSet<(usize, usize)>>,
    /// Answers that differ from what the step gives at its place in a run without crashes.
    mismatches: Mutex<Vec<String>>,
    /// The VM id each answered placement returned, by step key (a replay must give the same).
    placed: Mutex<BTreeMap<String, String>>,
}

/// The callers of a stream: the node's owner releases and reclaims, an outsider places spot VMs.
struct Callers {
    owner: String,
    outsider: String,
}

/// Sends a stream's steps from `progress.next` until the end, or until an answer does not
/// arrive because the host was killed. An answer lost while the host runs is asked for again
/// at once, with the same key.
fn drive(
    base: &str,
    callers: &Callers,
    index: usize,
    stream: &Stream,
    mut progress: Progress,
    tally: &Tally,
) -> Progress {
    while progress.next < stream.steps.len() {
        let k = progress.next;
        let step = &stream.steps[k];
        let retry = progress.unanswered;
        let request_id = format!("{}-a{}", step.key, progress.attempts);
        let token = match step.action {
            Action::PlaceSpot => &callers.outsider,
            _ => &callers.owner,
        };
        let client = Client::new(base, Some(token.clone())).with_timeout(
            match step.lose_first_answer_after {
                Some(patience) if progress.attempts == 0 => patience,
                _ => PATIENCE,
            },
        );
        progress.attempts += 1;
        tally.sent.fetch_add(1, Ordering::SeqCst);
        match send(&client, step, &request_id) {
            Err(_) if !tally.killed.load(Ordering::SeqCst) => {
                tally.lost_while_running.fetch_add(1, Ordering::SeqCst);
                progress.unanswered = true;
            }
            Err(_) => {
                progress.unanswered = true;
                return progress;
            }
            Ok((status, replayed, body)) => {
                tally.answered.fetch_add(1, Ordering::SeqCst);
                if replayed {
                    tally.replayed.fetch_add(1, Ordering::SeqCst);
                    if retry {
                        tally.replayed_retries.lock().unwrap().insert((index, k));
                    }
                }
                if step.action == Action::PlaceSpot && status == 201 {
                    let id = body["id"].as_str().unwrap_or_default().to_owned();
                    let mut placed = tally.placed.lock().unwrap();
                    if let Some(before) = placed.insert(step.key.clone(), id.clone()) {
                        tally.mismatches.lock().unwrap().push(format!(
                            "stream {index} step {k}: placed as {id}, earlier answered as {before}"
                        ));
                    }
                }
                let named = |id: &str| {
                    let placed = tally.placed.lock().unwrap();
                    placed
                        .iter()
                        .find(|(_, placed_id)| placed_id.as_str() == id)
                        .map_or_else(|| format!("unknown VM {id}"), |(key, _)| vm_name(key))
                };
                if let Some(problem) = check_answer(step, status, &body, named) {
                    tally.mismatches.lock().unwrap().push(format!(
                        "stream {index} step {k} (retry: {retry}, replayed: {replayed}): {problem}"
                    ));
                }
                progress = Progress {
                    next: k + 1,
                    unanswered: false,
                    attempts: 0,
                };
            }
        }
    }
    progress
}

/// What is wrong with an answer, compared with the step's answer in a run without crashes.
/// `named` gives the model's name of a VM id that an earlier answer returned.
fn check_answer(
    step: &Step,
    status: u16,
    body: &Value,
    named: impl Fn(&str) -> String,
) -> Option<String> {
    if status != step.expected_status {
        return Some(format!(
            "answered {status} {body}, expected {}",
            step.expected_status
        ));
    }
    if step.action == Action::PlaceSpot {
        return None;
    }
    let released: Option<BTreeSet<String>> = body["releasedUnitIds"].as_array().map(|list| {
        list.iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    });
    if released.as_ref() != Some(&step.released_after) {
        return Some(format!(
            "released {released:?}, expected {:?}",
            step.released_after
        ));
    }
    if step.action == Action::Reclaim {
        let mut terminated: Vec<String> = body["terminated"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .map(|id| named(id.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        terminated.sort();
        if terminated != step.terminates {
            return Some(format!(
                "terminated {} ({terminated:?}), expected {:?}",
                body["terminated"], step.terminates
            ));
        }
    }
    None
}

/// The request ids and `terminated` lists of the audit events of every attempt of one key.
fn events_of(db: &rusqlite::Connection, key: &str) -> Vec<(String, Vec<String>)> {
    db.prepare(
        "SELECT client_request_id, terminated FROM audit_events WHERE client_request_id LIKE ? || '-a%' ORDER BY seq",
    )
    .unwrap()
    .query_map([key], |r| {
        let terminated: String = r.get(1)?;
        Ok((
            r.get(0)?,
            serde_json::from_str(&terminated).unwrap_or_default(),
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// The model's name of every stored VM, from the `vm.place` event that created it (its
/// request id is `<step key>-a<attempt>`). Fails if a step created two VMs.
fn vm_names(db: &rusqlite::Connection) -> BTreeMap<String, String> {
    let mut statement = db
        .prepare("SELECT vm_id, client_request_id FROM audit_events WHERE action = 'vm.place'")
        .unwrap();
    let rows = statement
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .unwrap();
    let mut names = BTreeMap::new();
    let mut steps = BTreeMap::new();
    for row in rows {
        let (vm, request_id) = row.unwrap();
        let (key, attempt) = request_id
            .rsplit_once("-a")
            .unwrap_or_else(|| panic!("{vm} placed by an unknown request {request_id}"));
        assert!(attempt.parse::<usize>().is_ok(), "{request_id}");
        if let Some(other) = steps.insert(key.to_owned(), vm.clone()) {
            panic!("step {key} placed two VMs: {other} and {vm}");
        }
        names.insert(vm, vm_name(key));
    }
    names
}

/// The stream's state as stored: its reservation's released units and its VMs (on its units,
/// named as the model names them).
fn stored_state(db: &rusqlite::Connection, index: usize, stream: &Stream) -> StreamState {
    let names = vm_names(db);
    let (_, _, released) = reservation_state(db, &stream.reservation);
    let mut state = StreamState {
        released,
        ..StreamState::default()
    };
    let mut statement = db
        .prepare(
            "SELECT v.id, v.status, v.termination_reason, vu.unit_id FROM vms v \
             JOIN vm_units vu ON vu.vm_id = v.id WHERE vu.unit_id LIKE ?",
        )
        .unwrap();
    let rows = statement
        .query_map([format!("u{index}-%")], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .unwrap();
    for row in rows {
        let (id, status, reason, unit) = row.unwrap();
        let vm = names
            .get(&id)
            .unwrap_or_else(|| panic!("{id} has no placement event"))
            .clone();
        assert!(
            vm.starts_with(&format!("vm-{index}-")),
            "{id} ({vm}) was placed by another stream"
        );
        let running = status == "running";
        assert!(
            running || reason.as_deref() == Some("reclaimed"),
            "{vm} was terminated as {reason:?}; only reclaims terminate VMs in this run"
        );
        if running {
            state.running.insert(unit, vm.clone());
        }
        state.vms.insert(vm, running);
    }
    state
}

/// Rows that only make sense together: every VM has its units, every reservation its units,
/// running flags agree, the audit chain links up, and SQLite finds the file intact. Returns
/// how many checks it made.
fn assert_no_half_written_rows(db: &rusqlite::Connection) -> usize {
    let integrity: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let checks = [
        (
            "VMs without units",
            "SELECT count(*) FROM vms v WHERE NOT EXISTS (SELECT 1 FROM vm_units u WHERE u.vm_id = v.id)",
        ),
        (
            "VM units without a VM",
            "SELECT count(*) FROM vm_units u WHERE NOT EXISTS (SELECT 1 FROM vms v WHERE v.id = u.vm_id)",
        ),
        (
            "VM units whose running flag disagrees with the VM",
            "SELECT count(*) FROM vm_units u JOIN vms v ON v.id = u.vm_id WHERE (u.running = 1) <> (v.status = 'running')",
        ),
        (
            "reservations without units",
            "SELECT count(*) FROM reservations r WHERE NOT EXISTS (SELECT 1 FROM reservation_units u WHERE u.reservation_id = r.id)",
        ),
        (
            "audit events that do not link to the one before",
            "SELECT count(*) FROM audit_events a WHERE a.chain_seq > 1 AND NOT EXISTS (SELECT 1 FROM audit_events p WHERE p.chain = a.chain AND p.chain_seq = a.chain_seq - 1 AND p.hash = a.prev_hash)",
        ),
    ];
    for (what, sql) in checks {
        let count: i64 = db.query_row(sql, [], |r| r.get(0)).unwrap();
        assert_eq!(count, 0, "{what}: {count}");
    }
    checks.len() + 1
}

fn open_db(state: &Path) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(node_database(state)).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db
}

/// Orgs, keys, one node and one reservation per stream, made through `operator`; returns the
/// callers and each stream's planned steps.
fn open_market(
    operator: &Client,
    steps_per_stream: usize,
    rng: &mut Rng,
) -> (Callers, Vec<Stream>) {
    for org in ["owner", "tenant", "outsider"] {
        operator
            .post("/v1/orgs", &json!({ "id": org, "name": org }))
            .expect_status(201);
    }
    let token_of = |org: &str, role: &str| {
        operator
            .post(
                &format!("/v1/orgs/{org}/keys"),
                &json!({ "name": role, "role": role }),
            )
            .expect_status(201)
            .json()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let callers = Callers {
        owner: token_of("owner", "capacity-manager"),
        outsider: token_of("outsider", "member"),
    };
    let units: Vec<Vec<String>> = (0..STREAMS)
        .map(|s| (0..UNITS_PER_STREAM).map(|u| format!("u{s}-{u}")).collect())
        .collect();
    let all_units: Vec<&String> = units.iter().flatten().collect();
    operator
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": all_units }),
        )
        .expect_status(201);
    let streams: Vec<Stream> = units
        .iter()
        .enumerate()
        .map(|(index, units)| {
            let reservation = operator
                .post(
                    &format!("/v1/nodes/{NODE}/reservations"),
                    &json!({
                        "reservedUnitIds": units,
                        "allowedOrgIds": ["tenant"],
                        "startsAt": rfc3339_from_now(-3600),
                    }),
                )
                .expect_status(201)
                .json()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            plan_stream(index, reservation, units, steps_per_stream, rng)
        })
        .collect();
    (callers, streams)
}

/// Returns right after the next commit (or when nothing runs any more): a kill then lands
/// right after a request committed, often before its answer reached the client.
fn wait_for_the_next_commit(state: &Path, running: impl Fn() -> bool) {
    let watch = open_db(state);
    let last_event = || -> i64 {
        watch
            .query_row("SELECT coalesce(max(seq), 0) FROM audit_events", [], |r| {
                r.get(0)
            })
            .unwrap()
    };
    let seen = last_event();
    while last_event() == seen && running() {
        std::hint::spin_loop();
    }
}

/// With the host dead, each step a kill interrupted is in the database entirely or not at
/// all; records the ones that had committed. Returns (steps interrupted, checks made).
fn check_interrupted_steps(
    db: &rusqlite::Connection,
    streams: &[Stream],
    progress: &[Progress],
    committed_unanswered: &mut BTreeSet<(usize, usize)>,
) -> (usize, usize) {
    let mut interrupted = 0;
    let mut checks = 0;
    for (index, stream) in streams.iter().enumerate() {
        let at = progress[index];
        if !at.unanswered {
            continue;
        }
        interrupted += 1;
        let k = at.next;
        let step = &stream.steps[k];
        let events = events_of(db, &step.key);
        assert!(events.len() <= 1, "stream {index} step {k}: {events:?}");
        let applied = !events.is_empty();
        let expected = &stream.states[if applied { k + 1 } else { k }];
        assert_eq!(
            &stored_state(db, index, stream),
            expected,
            "stream {index} step {k} {:?} (audit event present: {applied}): \
             the stored state is neither all of it nor none of it",
            step.action
        );
        if applied {
            committed_unanswered.insert((index, k));
            if step.action == Action::Reclaim {
                let names = vm_names(db);
                let mut terminated: Vec<String> =
                    events[0].1.iter().map(|id| names[id].clone()).collect();
                terminated.sort();
                assert_eq!(terminated, step.terminates);
            }
        }
        checks += 1;
    }
    (interrupted, checks)
}

/// After the retries and the rest of the streams: the state of a run without crashes, one
/// audit event per successful step whatever its number of attempts, and a chain that
/// verifies. Returns the number of checks made.
fn check_converged(
    state: &Path,
    db: &rusqlite::Connection,
    operator: &Client,
    streams: &[Stream],
    progress: &[Progress],
    tally: &Tally,
    steps_per_stream: usize,
) -> usize {
    let mut final_checks = assert_no_half_written_rows(db);
    for (index, stream) in streams.iter().enumerate() {
        assert_eq!(
            progress[index].next, steps_per_stream,
            "stream {index} did not finish"
        );
        assert_eq!(
            stored_state(db, index, stream),
            stream.states[steps_per_stream],
            "stream {index}: the final state differs from a run without crashes"
        );
        final_checks += 1;
        for (k, step) in stream.steps.iter().enumerate() {
            let events = events_of(db, &step.key);
            let once = usize::from(step.expected_status < 300);
            assert_eq!(
                events.len(),
                once,
                "stream {index} step {k}: audit events of every attempt with one key: {events:?}"
            );
            final_checks += 1;
        }
    }
    // Every placement answered 201 named the VM that the audit trail says its step created.
    let names = vm_names(db);
    for (key, id) in tally.placed.lock().unwrap().iter() {
        assert_eq!(
            names.get(id),
            Some(&vm_name(key)),
            "{key} answered {id}, which it did not create"
        );
        final_checks += 1;
    }
    let verification = operator.get("/v1/audit/verify").expect_status(200).json();
    // Every cell's events: the node's, and the directory's orgs and keys.
    let count: i64 = local_cell_files(state, cells_under_test())
        .iter()
        .map(|path| {
            rusqlite::Connection::open(path)
                .unwrap()
                .query_row("SELECT count(*) FROM audit_events", [], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap()
        })
        .sum();
    assert_eq!(verification["ok"], true, "{verification}");
    assert_eq!(verification["eventsChecked"], count);
    final_checks += 1;
    final_checks
}

#[test]
fn killed_mid_stream_every_request_is_all_or_nothing_and_retries_converge() {
    ensure_components_built();
    let state = TempDir::new("crash");
    let seed = seed("CRASH_SEED");
    let mut rng = Rng::new(seed);
    let kills_wanted = scale("CRASH_KILLS", CRASHES);
    // Each kill comes a few answers after the last restart: enough steps for every kill.
    let steps_per_stream = 40.max(4 * (kills_wanted + EXTRA_KILLS));

    // The market, through the first host: one node, one reservation per stream.
    let mut host = Some(start_host(state.path()));
    let operator = Client::new(
        &host.as_ref().unwrap().base,
        Some(OPERATOR_TOKEN.to_owned()),
    );
    let (callers, streams) = open_market(&operator, steps_per_stream, &mut rng);

    let tally = Tally::default();
    let mut progress = [Progress::default(); STREAMS];
    let mut interrupted = 0;
    let mut all_or_nothing_checks = 0;
    // Steps interrupted by a kill whose attempt had committed: (stream, step).
    let mut committed_unanswered = BTreeSet::new();
    let mut kills = 0;
    loop {
        // Every stream goes on from where it stopped; the host dies a few answers later, while
        // the other streams' requests are in flight.
        let landed = interrupted > 0 && !committed_unanswered.is_empty();
        let kill_again = kills < kills_wanted || (!landed && kills < kills_wanted + EXTRA_KILLS);
        let kill_after =
            kill_again.then(|| tally.answered.load(Ordering::SeqCst) + 2 + rng.below(8));
        let base = host.as_ref().expect("a running host").base.clone();
        std::thread::scope(|scope| {
            let workers: Vec<_> = streams
                .iter()
                .enumerate()
                .map(|(index, stream)| {
                    let (base, tally, callers) = (&base, &tally, &callers);
                    let from = progress[index];
                    scope.spawn(move || drive(base, callers, index, stream, from, tally))
                })
                .collect();
            if let Some(kill_after) = kill_after {
                while tally.answered.load(Ordering::SeqCst) < kill_after
                    && workers.iter().any(|w| !w.is_finished())
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                wait_for_the_next_commit(state.path(), || workers.iter().any(|w| !w.is_finished()));
                tally.killed.store(true, Ordering::SeqCst);
                host.take().expect("a running host").kill();
                kills += 1;
            }
            for (index, worker) in workers.into_iter().enumerate() {
                progress[index] = worker.join().expect("stream thread");
            }
        });
        if kill_after.is_none() {
            break;
        }

        // The host is dead: each interrupted step is in the database entirely or not at all.
        let db = open_db(state.path());
        all_or_nothing_checks += assert_no_half_written_rows(&db);
        let (interrupted_now, checks) =
            check_interrupted_steps(&db, &streams, &progress, &mut committed_unanswered);
        interrupted += interrupted_now;
        all_or_nothing_checks += checks;
        drop(db);
        host = Some(start_host(state.path()));
        tally.killed.store(false, Ordering::SeqCst);
    }

    // After the retries and the rest of the streams: the state of a run without crashes, and
    // one audit event per successful step, whatever its number of attempts.
    let db = open_db(state.path());
    let operator = Client::new(
        &host.as_ref().unwrap().base,
        Some(OPERATOR_TOKEN.to_owned()),
    );
    let final_checks = check_converged(
        state.path(),
        &db,
        &operator,
        &streams,
        &progress,
        &tally,
        steps_per_stream,
    );

    let mismatches = tally.mismatches.lock().unwrap();
    let replayed_retries = tally.replayed_retries.lock().unwrap();
    println!(
        "crash: seed {seed}, {kills} SIGKILLs, {} requests sent, {} answered ({} replays), \
         {} answers lost while the host ran, {interrupted} requests interrupted by a kill \
         ({} of them had committed), {all_or_nothing_checks} all-or-nothing checks, \
         {final_checks} final checks",
        tally.sent.load(Ordering::SeqCst),
        tally.answered.load(Ordering::SeqCst),
        tally.replayed.load(Ordering::SeqCst),
        tally.lost_while_running.load(Ordering::SeqCst),
        committed_unanswered.len(),
    );
    assert!(
        mismatches.is_empty(),
        "answers that differ from a run without crashes:\n{}",
        mismatches.join("\n")
    );
    // The kills landed: some interrupted a request, some a request that had committed (whose
    // retry must then be a replay, below), so the checks above had something to check.
    assert!(
        kills >= kills_wanted,
        "{kills} kills, {kills_wanted} wanted"
    );
    assert!(
        interrupted > 0,
        "no kill interrupted a request in {kills} kills"
    );
    assert!(
        !committed_unanswered.is_empty(),
        "no kill landed between a commit and its answer in {kills} kills"
    );
    assert!(
        committed_unanswered.is_subset(&replayed_retries),
        "every committed, unanswered request was retried and replayed"
    );
    let carried_out_twice: Vec<_> = committed_unanswered.difference(&replayed_retries).collect();
    assert!(
        carried_out_twice.is_empty(),
        "steps committed before the kill whose retry was not a replay: {carried_out_twice:?}"
    );
}
