//! Replicas: several hosts serve one state at once, as replicas behind a load balancer share
//! one database and one key-value store. Two in-process hosts on one state directory (local
//! files), and three `spin-host` processes with their own state directories on one sqld and
//! one Redis (Spin's runtime config). The concurrent workload's clients spread their
//! requests (and their idempotent replays) over them, and every check of the single-host run
//! must still hold; and on sqld no read is ever answered busy, whatever writes run beside it.
//! The faults of a shared deployment are in [`crate::faults`].

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

use api_support::latency::Percentiles;
use api_support::positions::cells_under_test;
use api_support::stores::RemoteStores;
use api_support::workload::{assert_every_host_served, run_and_verify};
use api_support::{App, Client, HostProcess, Reply, ReservationSpec, Scenario, SetOnDrop, TempDir};

const THREADS: usize = 12;
/// Per client in CI; `WORKLOAD_OPERATIONS=<total>` sets the whole run's size (soak: 100000).
const OPERATIONS_PER_THREAD: usize = 32;

/// A second host on `app`'s state directory.
#[test]
fn two_hosts_on_one_state_keep_every_invariant() {
    let _machine = api_support::machine_to_itself();
    let app = App::start();
    let replica = app.another_host();
    let bases = [app.base.clone(), replica.base_url()];
    let records = run_and_verify(&app, &bases, THREADS, OPERATIONS_PER_THREAD, "two hosts");
    assert_every_host_served(&records, &bases);
}

// ---------------------------------------------------------------- many processes, shared stores

/// A `spin-host` process: its own state directory, the shared stores through the runtime
/// config, as one replica of a deployment.
pub struct Replica {
    process: HostProcess,
    pub base: String,
    _state: TempDir,
}

impl Replica {
    pub fn start(stores: &RemoteStores) -> Replica {
        let state = TempDir::new("replica");
        let log = std::fs::File::create(state.path().join("host.log")).expect("host log");
        // With the market in cells, the manifest that grants every cell's label.
        let manifest = (!stores.cells.is_empty())
            .then(|| api_support::app::cells_manifest(stores.cells.len() + 1));
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--runtime-config-file".as_ref(),
            stores.runtime_config().as_os_str(),
        ];
        if let Some(manifest) = &manifest {
            args.extend(["--manifest".as_ref(), manifest.as_os_str()]);
        }
        let process = HostProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_spin-host")),
            state.path(),
            log,
            &args,
        );
        Replica {
            base: process.base.clone(),
            process,
            _state: state,
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(self) {
        self.process.kill();
    }
}

/// Three `spin-host` processes, each with its own state directory, on one sqld and one Redis:
/// the concurrent workload spreads its clients (and their replays and concurrent twins) over
/// them, and every check of the single-host run must still hold, from the audit replay to
/// the rows in sqld.
#[test]
fn three_processes_on_one_sqld_and_one_redis_keep_every_invariant() {
    let _machine = api_support::machine_to_itself();
    let dir = TempDir::new("shared-stores");
    let stores = RemoteStores::start_in_cells(dir.path(), cells_under_test());
    // Starting together: each replica meets an empty database.
    let replicas: Vec<Replica> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..REPLICAS)
            .map(|_| scope.spawn(|| Replica::start(&stores)))
            .collect();
        starting.into_iter().map(|s| s.join().unwrap()).collect()
    });
    // Fixtures and checks through a fourth host on the same stores.
    let app = App::start_on(&stores);
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let hosts = format!("{REPLICAS} processes on sqld + Redis");
    let records = run_and_verify(&app, &bases, THREADS, OPERATIONS_PER_THREAD, &hosts);
    assert_every_host_served(&records, &bases);
}

const REPLICAS: usize = 3;

/// Writers of the burst, each sending this many releases and reclaims.
const WRITERS: usize = 32;
const WRITES_PER_WRITER: usize = 16;
const READERS: usize = 8;

/// Three replicas on one sqld: while writers release and reclaim on every node as fast as
/// they are answered (the write lock always held by someone, sqld busy with requests), readers
/// send every kind of read and dry run to every replica. A read waits for no writer: not one
/// of them may be answered 503 (or anything but 200), and they must have been many.
#[test]
fn reads_and_dry_runs_beside_a_write_burst_on_three_replicas_are_never_busy() {
    let _machine = api_support::machine_to_itself();
    let dir = TempDir::new("busy-reads");
    let stores = RemoteStores::start_in_cells(dir.path(), cells_under_test());
    let replicas: Vec<Replica> = (0..REPLICAS).map(|_| Replica::start(&stores)).collect();
    let app = App::start_on(&stores);
    let units: Vec<String> = (0..8).map(|u| format!("g{u}")).collect();
    let units: Vec<&str> = units.iter().map(String::as_str).collect();
    let nodes = ["n1", "n2"];
    let mut scenario = Scenario::new()
        .orgs(&["owner", "aud"])
        .key("owner", "owner", "capacity-manager")
        .key("viewer", "aud", "viewer");
    for node in nodes {
        scenario = scenario
            .node(node, "owner", &units)
            .reservation(node, ReservationSpec::on(node, &units).audience(&["aud"]));
    }
    let fixtures = scenario.make_in(&app);
    let at = |client: &Client, base: &str| Client::new(base, client.token().map(str::to_owned));
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let writing = AtomicBool::new(true);
    let (reads, writes) = std::thread::scope(|scope| {
        // The readers stop however this thread leaves the scope, a writer's panic included.
        let done_writing = SetOnDrop::new(&writing, false);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (bases, fixtures, units) = (&bases, &fixtures, &units);
                scope.spawn(move || {
                    let mut answered = 0;
                    for i in 0..WRITES_PER_WRITER {
                        let owner = at(&fixtures.client("owner"), &bases[(w + i) % bases.len()]);
                        let node = nodes[w % nodes.len()];
                        let action = if i % 2 == 0 { "release" } else { "reclaim" };
                        let reply = owner.post(
                            &format!("{}/{action}", fixtures.reservation_path(node)),
                            &json!({ "unitIds": [units[(w + i) % units.len()]], "reason": "burst" }),
                        );
                        answered += usize::from(reply.status == 200);
                    }
                    answered
                })
            })
            .collect();
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (bases, fixtures, writing) = (&bases, &fixtures, &writing);
                scope.spawn(move || {
                    let mut reads = Vec::new();
                    let mut i = r;
                    while writing.load(Ordering::SeqCst) || reads.len() < 8 {
                        let base = &bases[i % bases.len()];
                        let owner = at(&fixtures.client("owner"), base);
                        let viewer = at(&fixtures.client("viewer"), base);
                        let node = nodes[i % nodes.len()];
                        let reservation = fixtures.reservation_path(node);
                        let reply = match i % 6 {
                            0 => owner.post(
                                &format!("{reservation}/reclaim/dry-run"),
                                &json!({ "unitIds": ["g0", "g1"] }),
                            ),
                            1 => owner.get(&reservation),
                            2 => viewer.get(&format!("/v1/nodes/{node}/reservations")),
                            3 => viewer.get("/v1/market"),
                            4 => owner.get(&format!("/v1/nodes/{node}")),
                            _ => viewer.get("/v1/events?limit=5"),
                        };
                        reads.push((i % 6, reply.status, reply.text()));
                        i += 1;
                    }
                    reads
                })
            })
            .collect();
        let writes: usize = writers
            .into_iter()
            .map(|w| w.join().expect("a writer"))
            .sum();
        drop(done_writing);
        let reads: Vec<_> = readers
            .into_iter()
            .flat_map(|r| r.join().expect("a reader"))
            .collect();
        (reads, writes)
    });
    let refused: Vec<_> = reads
        .iter()
        .filter(|(_, status, _)| *status != 200)
        .collect();
    println!(
        "{} reads and dry runs beside {writes} writes answered 200 of {}",
        reads.len() - refused.len(),
        WRITERS * WRITES_PER_WRITER
    );
    assert!(refused.is_empty(), "reads not answered 200: {refused:#?}");
    assert!(writes > 0, "no write of the burst succeeded");
    assert!(reads.len() >= READERS * 8, "{} reads", reads.len());
}

/// How long the hot node, the spread writers and the readers run together in CI;
/// `HOT_AND_SPREAD_SECONDS=1200` is the 20-minute soak.
const HOT_AND_SPREAD_SECONDS: usize = 8;

/// One writer's view of its own unit: what its answers said, and how long each took.
#[derive(Default)]
struct WriterLog {
    answered: usize,
    contention: usize,
    unexpected: Vec<(u16, String)>,
    /// Whether the unit is released after the writer's last 200.
    released: bool,
    latencies: Vec<std::time::Duration>,
}

/// A 503 `write-contention` with `Retry-After`: a write that changed nothing.
fn is_write_contention(reply: &Reply) -> bool {
    let contention = serde_json::from_slice::<serde_json::Value>(&reply.body)
        .is_ok_and(|problem| problem["code"] == "write-contention");
    contention && reply.header("retry-after").is_some()
}

/// Three replicas on one sqld, for a while: 32 writers on one hot node (each releasing and
/// reclaiming its own unit of one reservation), 32 writers spread over 32 nodes, and readers
/// of every kind. Every write is answered 200 or 503 `write-contention` with `Retry-After`
/// (which changed nothing), every read 200; sqld never stalls (the stores' watchdog); and
/// afterwards each unit is as its writer's last 200 left it, the trail holds exactly one
/// event per write answered 200, and every chain verifies.
#[test]
fn a_hot_node_spread_writers_and_readers_on_three_replicas_keep_every_rule() {
    use std::time::{Duration, Instant};

    let _machine = api_support::machine_to_itself();
    let seconds = api_support::random::scale("HOT_AND_SPREAD_SECONDS", HOT_AND_SPREAD_SECONDS);
    let dir = TempDir::new("hot-and-spread");
    let stores = RemoteStores::start_in_cells(dir.path(), cells_under_test());
    let replicas: Vec<Replica> = (0..REPLICAS).map(|_| Replica::start(&stores)).collect();
    let app = App::start_on(&stores);
    let hot_units: Vec<String> = (0..WRITERS).map(|u| format!("h{u}")).collect();
    let hot_unit_refs: Vec<&str> = hot_units.iter().map(String::as_str).collect();
    let spread_nodes: Vec<String> = (0..WRITERS).map(|n| format!("s{n}")).collect();
    let mut scenario = Scenario::new()
        .orgs(&["hot", "spread", "aud"])
        .key("hot", "hot", "capacity-manager")
        .key("spread", "spread", "capacity-manager")
        .key("viewer", "aud", "viewer")
        .node("hot-node", "hot", &hot_unit_refs)
        .reservation(
            "hot",
            ReservationSpec::on("hot-node", &hot_unit_refs).audience(&["aud"]),
        );
    for node in &spread_nodes {
        scenario = scenario
            .node(node, "spread", &["u0"])
            .reservation(node, ReservationSpec::on(node, &["u0"]).audience(&["aud"]));
    }
    let fixtures = scenario.make_in(&app);
    let at = |client: &Client, base: &str| Client::new(base, client.token().map(str::to_owned));
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    // (writer's client, reservation path, unit) for the hot writers, then the spread ones.
    let writers: Vec<(Client, String, String)> = (0..WRITERS)
        .map(|w| {
            (
                at(&fixtures.client("hot"), &bases[w % bases.len()]),
                fixtures.reservation_path("hot"),
                hot_units[w].clone(),
            )
        })
        .chain((0..WRITERS).map(|w| {
            (
                at(&fixtures.client("spread"), &bases[w % bases.len()]),
                fixtures.reservation_path(&spread_nodes[w]),
                "u0".to_owned(),
            )
        }))
        .collect();

    let deadline = Instant::now() + Duration::from_secs(seconds as u64);
    let (logs, reads) = std::thread::scope(|scope| {
        let writing: Vec<_> = writers
            .iter()
            .map(|(client, reservation, unit)| {
                let client = client.with_header("prefer", "return=minimal");
                scope.spawn(move || {
                    let mut log = WriterLog::default();
                    while Instant::now() < deadline {
                        let action = if log.released { "reclaim" } else { "release" };
                        let started = Instant::now();
                        let reply = client.post(
                            &format!("{reservation}/{action}"),
                            &json!({ "unitIds": [unit], "reason": "soak" }),
                        );
                        log.latencies.push(started.elapsed());
                        match reply.status {
                            200 => {
                                log.answered += 1;
                                log.released = !log.released;
                            }
                            503 if is_write_contention(&reply) => log.contention += 1,
                            status => log.unexpected.push((status, reply.text())),
                        }
                    }
                    log
                })
            })
            .collect();
        let reading: Vec<_> = (0..READERS)
            .map(|r| {
                let (bases, fixtures, spread_nodes) = (&bases, &fixtures, &spread_nodes);
                scope.spawn(move || {
                    let mut reads = Vec::new();
                    let mut i = r;
                    while Instant::now() < deadline {
                        let base = &bases[i % bases.len()];
                        let hot = at(&fixtures.client("hot"), base);
                        let viewer = at(&fixtures.client("viewer"), base);
                        let spread = fixtures.reservation_path(&spread_nodes[i % WRITERS]);
                        let started = Instant::now();
                        let reply = match i % 5 {
                            0 => hot.post(
                                &format!("{}/reclaim/dry-run", fixtures.reservation_path("hot")),
                                &json!({ "unitIds": ["h0", "h1"] }),
                            ),
                            1 => hot.get(&fixtures.reservation_path("hot")),
                            2 => viewer.get(&spread),
                            3 => viewer.get("/v1/market"),
                            _ => viewer.get("/v1/nodes/hot-node/reservations"),
                        };
                        reads.push((reply.status, started.elapsed(), reply.text()));
                        i += 1;
                    }
                    reads
                })
            })
            .collect();
        let logs: Vec<WriterLog> = writing
            .into_iter()
            .map(|w| w.join().expect("a writer"))
            .collect();
        let reads: Vec<_> = reading
            .into_iter()
            .flat_map(|r| r.join().expect("a reader"))
            .collect();
        (logs, reads)
    });

    let (hot, spread) = logs.split_at(WRITERS);
    for (group, logs) in [("hot node", hot), ("spread", spread)] {
        let answered: usize = logs.iter().map(|l| l.answered).sum();
        let contention: usize = logs.iter().map(|l| l.contention).sum();
        let latencies: Vec<Duration> = logs.iter().flat_map(|l| l.latencies.clone()).collect();
        let Percentiles { p50, p99, max } = Percentiles::of(latencies);
        println!(
            "{group}: {answered} writes answered 200 in {seconds} s ({:.1}/s), {contention} \
             refused write-contention; p50 {p50:.1?}, p99 {p99:.1?}, max {max:.1?}",
            answered as f64 / seconds as f64
        );
        assert!(answered > 0, "no {group} write succeeded");
    }
    let reading = Percentiles::of(reads.iter().map(|r| r.1).collect());
    println!(
        "{} reads: p50 {:.1?}, p99 {:.1?}, max {:.1?}",
        reads.len(),
        reading.p50,
        reading.p99,
        reading.max
    );
    let unexpected: Vec<_> = logs.iter().flat_map(|l| l.unexpected.clone()).collect();
    assert!(
        unexpected.is_empty(),
        "writes answered otherwise: {unexpected:#?}"
    );
    let refused_reads: Vec<_> = reads.iter().filter(|r| r.0 != 200).collect();
    assert!(
        refused_reads.is_empty(),
        "reads not answered 200: {refused_reads:#?}"
    );

    // Each unit is as its writer's last 200 left it.
    let operator = app.operator();
    let hot_reservation = operator
        .get(&fixtures.reservation_path("hot"))
        .expect_status(200)
        .json();
    let released_hot: BTreeSet<String> = api_support::strings(&hot_reservation["releasedUnitIds"])
        .into_iter()
        .collect();
    for (w, log) in hot.iter().enumerate() {
        assert_eq!(
            released_hot.contains(&hot_units[w]),
            log.released,
            "hot unit {}",
            hot_units[w]
        );
    }
    for (w, log) in spread.iter().enumerate() {
        let reservation = operator
            .get(&fixtures.reservation_path(&spread_nodes[w]))
            .expect_status(200)
            .json();
        let released = !reservation["releasedUnitIds"]
            .as_array()
            .unwrap()
            .is_empty();
        assert_eq!(released, log.released, "spread node {}", spread_nodes[w]);
    }
    // One event per write answered 200, and every chain verifies.
    let events: i64 = app
        .db()
        .query_row(
            "SELECT COUNT(*) FROM audit_events \
             WHERE action IN ('reservation.release', 'reservation.reclaim')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let answered: usize = logs.iter().map(|l| l.answered).sum();
    assert_eq!(events as usize, answered, "release and reclaim events");
    let verified = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(verified["ok"], true, "{verified}");
}
