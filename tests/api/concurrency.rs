//! Many clients at once against one running app: releases, reclaims, dry runs, placements of
//! every tier, terminations, topology changes, re-affirmations, idempotent replays and
//! identical requests sent twice at once. The run is seeded (the seed is printed;
//! `WORKLOAD_SEED=<n>` replays the same choices), and afterwards the database, the audit
//! trail and every answer are checked against each other and against the rules (see
//! `workload`). The checks themselves are shown to catch a database that breaks the rules.

use api_support::App;
use api_support::workload::{Market, last_seq, run, run_and_verify, verify};

const THREADS: usize = 16;
/// Per client in CI; `WORKLOAD_OPERATIONS=<total>` sets the whole run's size (soak: 100000).
const OPERATIONS_PER_THREAD: usize = 30;

#[test]
fn concurrent_clients_keep_every_invariant() {
    let _machine = api_support::machine_to_itself();
    let app = App::start();
    run_and_verify(
        &app,
        std::slice::from_ref(&app.base),
        THREADS,
        OPERATIONS_PER_THREAD,
        "one host",
    );
}

/// Each tampering, made in a transaction the checks read through and then rolled back, must
/// be reported: otherwise a clean verdict would prove nothing. The checks are the same on
/// every store; the tampering holds the database's write lock behind the app's back, which
/// only local files allow (a sqld beside it finds its database busy).
#[test]
fn the_checks_catch_a_database_that_breaks_the_rules() {
    let app = App::start_on_local_files();
    let market = Market::setup(&app);
    let setup_seq = last_seq(&app.db());
    let records = run(&market, std::slice::from_ref(&app.base), 4, 15, 7);
    let db = app.db();
    verify(&db, &app.operator(), &records, setup_seq).assert_clean();
    let tamperings = [
        (
            "the last mutation's audit event is lost",
            "DELETE FROM audit_events WHERE seq = (SELECT max(seq) FROM audit_events)",
        ),
        (
            "an audit event names another request",
            "UPDATE audit_events SET client_request_id = 'someone-else' \
             WHERE seq = (SELECT max(seq) FROM audit_events)",
        ),
        (
            "a reservation is cancelled behind the API",
            "UPDATE reservations SET state = 'cancelled' WHERE id = (SELECT min(id) FROM reservations)",
        ),
        (
            "a VM appears that nobody placed",
            "INSERT INTO vms (id, org_id, node_id, tier, status, created_at) \
             VALUES ('vm-phantom', 'tenant-a', 'n0', 'spot', 'running', 0)",
        ),
        (
            "a unit disappears from a node",
            "DELETE FROM node_units WHERE node_id = 'n0' AND unit_id = 'g7'",
        ),
    ];
    for (what, tampering) in tamperings {
        db.execute_batch("BEGIN").unwrap();
        db.execute_batch(tampering)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let verdict = verify(&db, &app.operator(), &records, setup_seq);
        db.execute_batch("ROLLBACK").unwrap();
        assert!(
            !verdict.violations.is_empty(),
            "the checks did not notice that {what}"
        );
    }
}
