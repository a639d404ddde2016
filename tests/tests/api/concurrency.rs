//! Many clients at once against one running app: releases, reclaims, dry runs, placements of
//! every tier, terminations, topology changes, re-affirmations and idempotent replays. The
//! run is seeded (the seed is printed; `WORKLOAD_SEED=<n>` replays the same choices), and
//! afterwards the database, the audit trail and every answer are checked against each other
//! and against the rules (see `workload`).

use crate::support::App;
use crate::workload::{Market, last_seq, run, seed, verify};

const THREADS: usize = 12;
const OPERATIONS_PER_THREAD: usize = 32;

#[test]
fn concurrent_clients_keep_every_invariant() {
    let app = App::start();
    let market = Market::setup(&app);
    let setup_seq = last_seq(&app.db());
    let seed = seed("WORKLOAD_SEED");
    let records = run(
        &market,
        std::slice::from_ref(&app.base),
        THREADS,
        OPERATIONS_PER_THREAD,
        seed,
    );
    let verdict = verify(&app.db(), &app.operator(), &records, setup_seq);
    verdict.print(&format!("one host, {THREADS} clients, seed {seed}"));
    verdict.assert_clean();
}
