//! Two instances, one state: two hosts serve the same state directory at once, as two
//! replicas behind a load balancer would share one database and one key-value store. The
//! concurrent workload's clients spread their requests (and their idempotent replays) over
//! both, and every check of the single-host run must still hold.

use spin_host::{Host, HostConfig};

use crate::support::{AUDIT_KEY, App, OPERATOR_TOKEN, workspace};
use crate::workload::{Market, last_seq, run, scale, seed, verify};

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
    let app = App::start();
    let replica = replica_of(&app);
    let market = Market::setup(&app);
    let setup_seq = last_seq(&app.db());
    let seed = seed("WORKLOAD_SEED");
    let per_thread =
        scale("WORKLOAD_OPERATIONS", THREADS * OPERATIONS_PER_THREAD).div_ceil(THREADS);
    let bases = [app.base.clone(), replica.base_url()];
    let records = run(&market, &bases, THREADS, per_thread, seed);
    for base in &bases {
        let served = records.iter().filter(|r| &r.base == base).count();
        assert!(served > 0, "{base} served no request");
    }
    let verdict = verify(&app.db(), &app.operator(), &records, setup_seq);
    verdict.print(&format!("two hosts, {THREADS} clients, seed {seed}"));
    verdict.assert_clean();
}
