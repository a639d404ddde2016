//! Replicas: several hosts serve one state at once, as replicas behind a load balancer share
//! one database and one key-value store. Two in-process hosts on one state directory (local
//! files), and three `spin-host` processes with their own state directories on one sqld and
//! one Redis (Spin's runtime config). The concurrent workload's clients spread their
//! requests (and their idempotent replays) over them, and every check of the single-host run
//! must still hold; and on sqld no read is ever answered busy, whatever writes run beside it.
//! The faults of a shared deployment are in [`crate::faults`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

use spin_host::{Host, HostConfig};

use api_support::stores::RemoteStores;
use api_support::workload::{assert_every_host_served, run_and_verify};
use api_support::{
    AUDIT_KEY, App, Client, HostProcess, OPERATOR_TOKEN, ReservationSpec, Scenario, TempDir,
    workspace,
};

const THREADS: usize = 12;
/// Per client in CI; `WORKLOAD_OPERATIONS=<total>` sets the whole run's size (soak: 100000).
const OPERATIONS_PER_THREAD: usize = 32;

/// A second host on `app`'s state directory.
fn replica_of(app: &App) -> Host {
    let mut config = HostConfig::new(workspace().join("spin.toml"))
        .state_dir(app.state_dir())
        .env("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("SPIN_VARIABLE_AUDIT_KEY", AUDIT_KEY);
    config.log_requests = false;
    config.print_banner = false;
    Host::start(config).expect("the replica starts")
}

#[test]
fn two_hosts_on_one_state_keep_every_invariant() {
    let _machine = api_support::machine_to_itself();
    let app = App::start();
    let replica = replica_of(&app);
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
        let process = HostProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_spin-host")),
            state.path(),
            log,
            &[
                "--runtime-config-file".as_ref(),
                stores.runtime_config().as_os_str(),
            ],
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
    let stores = RemoteStores::start(dir.path());
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
    let stores = RemoteStores::start(dir.path());
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
        writing.store(false, Ordering::SeqCst);
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
