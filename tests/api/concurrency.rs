//! Many clients at once against one running app: releases, reclaims, dry runs, placements of
//! every tier, terminations, topology changes, re-affirmations, idempotent replays and
//! identical requests sent twice at once. The run is seeded (the seed is printed;
//! `WORKLOAD_SEED=<n>` replays the same choices), and afterwards the database, the audit
//! trail and every answer are checked against each other and against the rules (see
//! `workload`). The checks themselves are shown to catch a database that breaks the rules.

use api_support::App;
use api_support::workload::{
    EXTRA_UNIT, Kind, Market, NODE_UNITS, Record, last_seq, run, run_and_verify, trail_marks,
    verify, verify_cells,
};
use serde_json::{Value, json};

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

/// The model decides every answer: each tampering of a run's answers (a record kept as the
/// client got it, changed before the checks read it) must be reported by the answer check,
/// which says what the model answers instead. Otherwise a clean verdict would prove nothing
/// about the answers. With cells, each cell's answers are judged on its own trail.
#[test]
fn the_model_catches_answers_that_break_the_rules() {
    let app = App::start();
    let market = Market::setup(&app);
    let marks = trail_marks(&app);
    let records = run(&market, std::slice::from_ref(&app.base), 16, 30, 11);
    verify_cells(&app, &records, &marks).assert_clean();

    type Tampering = fn(&Record, &Value) -> Option<Value>;
    let tamperings: [(&str, Tampering); 4] = [
        (
            "a capacity request without the permission answered 403, not 404",
            |record, body| {
                (record.kind == Kind::CapacityWithoutPermission).then(|| {
                    let mut body = body.clone();
                    body["status"] = json!(403);
                    body["code"] = json!("forbidden");
                    body
                })
            },
        ),
        ("a refusal lists a unit it should not", |record, body| {
            (record.status >= 400).then_some(())?;
            let mut body = body.clone();
            let units = body["unitIds"].as_array_mut()?;
            let unlisted = NODE_UNITS
                .iter()
                .chain([&EXTRA_UNIT])
                .find(|unit| !units.contains(&json!(unit)))?;
            units.push(json!(unlisted));
            Some(body)
        }),
        (
            "an answer leaves out a VM (a dry run's, or a refusal's units-not-idle)",
            |record, body| {
                let mut body = body.clone();
                let member = ["wouldTerminate", "wouldSkip", "vmIds"]
                    .into_iter()
                    .find(|member| body[member].as_array().is_some_and(|vms| !vms.is_empty()))?;
                (record.kind == Kind::DryRun || member == "vmIds").then_some(())?;
                body[member].as_array_mut()?.pop();
                Some(body)
            },
        ),
        ("a refusal gives another reason", |record, body| {
            (record.status >= 400).then_some(())?;
            let mut body = body.clone();
            let other = if body["code"] == "units-in-use" {
                "units-not-idle"
            } else {
                "units-in-use"
            };
            body["code"] = json!(other);
            Some(body)
        }),
    ];
    // Under concurrency the model may accept more than one answer for a request (another
    // request it raced may have come first), so a tampered answer it accepts is not always
    // a miss: each kind of tampering is tried on the run's answers in turn, and the model
    // must catch it on at least one of them.
    for (what, tamper) in tamperings {
        let candidates: Vec<(usize, Value)> = records
            .iter()
            .enumerate()
            .filter(|(_, record)| record.replay_of.is_none() && record.kind != Kind::Replay)
            .filter_map(|(index, record)| tamper(record, &record.json()).map(|body| (index, body)))
            .take(TAMPERED_ANSWERS_TRIED)
            .collect();
        assert!(
            !candidates.is_empty(),
            "the run has no answer to tamper with so that {what}"
        );
        let caught = candidates.iter().find_map(|(index, body)| {
            let mut tampered = records.clone();
            let record = &mut tampered[*index];
            if let Some(status) = body["status"].as_u64() {
                record.status = status as u16;
            }
            record.body = serde_json::to_vec(body).unwrap();
            let verdict = verify_cells(&app, &tampered, &marks);
            verdict.violations.into_iter().find(|v| {
                v.starts_with(&records[*index].request_id) && v.contains("the model answers")
            })
        });
        eprintln!("{what}: {caught:?}");
        assert!(
            caught.is_some(),
            "the model did not notice that {what} in any of {} tampered answers",
            candidates.len()
        );
    }
}

/// How many of a run's answers each kind of tampering is tried on, at most.
const TAMPERED_ANSWERS_TRIED: usize = 8;
