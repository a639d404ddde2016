//! Replicas: several hosts serve one state at once, as replicas behind a load balancer share
//! one database and one key-value store. Two in-process hosts on one state directory (local
//! files), and three `spin-host` processes with their own state directories on one sqld and
//! one Redis (Spin's runtime config). The concurrent workload's clients spread their
//! requests (and their idempotent replays) over them, and every check of the single-host run
//! must still hold. The faults of a shared deployment are in [`crate::faults`].

use std::path::Path;

use spin_host::{Host, HostConfig};

use api_support::stores::RemoteStores;
use api_support::workload::{assert_every_host_served, run_and_verify};
use api_support::{AUDIT_KEY, App, HostProcess, OPERATOR_TOKEN, TempDir, workspace};

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
