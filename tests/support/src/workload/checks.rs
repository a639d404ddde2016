//! The checks of a run: every answer against the model, the audit trail against the
//! answers, and the database against the history.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use api_client::Client;

use crate::app::App;
use crate::random::{scale, seed};

use super::market::Market;
use serde_json::{Value, json};

use super::generate::{Kind, Record};
use super::model::{Event, Model, events, observed, replay};

/// What the checks counted.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub by_kind: BTreeMap<String, BTreeMap<u16, usize>>,
    pub invariants_checked: usize,
    pub audit_events: usize,
    /// Answers the model decided (every record but replays).
    pub answers_checked: usize,
    /// Requests sent again after a 503 that asked for a retry.
    pub retried: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    pub(crate) fn check(&mut self, holds: bool, violation: impl FnOnce() -> String) {
        self.invariants_checked += 1;
        if !holds {
            self.violations.push(violation());
        }
    }

    pub fn print(&self, title: &str) {
        println!(
            "{title}: {} operations ({} sent again after a 503 that asked for it), {} answers decided by the model, {} audit events replayed, {} invariant checks, {} violations",
            self.operations,
            self.retried,
            self.answers_checked,
            self.audit_events,
            self.invariants_checked,
            self.violations.len()
        );
        for (kind, statuses) in &self.by_kind {
            println!("  {kind:<28} {statuses:?}");
        }
    }

    /// Takes in the verdict of another part of the same run (another cell's).
    fn absorb(&mut self, other: Verdict) {
        self.operations += other.operations;
        for (kind, statuses) in other.by_kind {
            let into = self.by_kind.entry(kind).or_default();
            for (status, count) in statuses {
                *into.entry(status).or_default() += count;
            }
        }
        self.invariants_checked += other.invariants_checked;
        self.audit_events += other.audit_events;
        self.answers_checked += other.answers_checked;
        self.retried += other.retried;
        self.violations.extend(other.violations);
    }

    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(
            self.violations.is_empty(),
            "{} violations:\n{}",
            self.violations.len(),
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// A request whose answer the model must give in one of the states after events `lo..=hi`.
pub(crate) struct Expectation {
    pub(crate) record: usize,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
    /// What the model answered at the first state of the window, for the report.
    pub(crate) first_answer: Option<Value>,
}

/// For every record that is not a replay, the window of states it may have seen: exactly
/// the state before its own event for a 2xx mutation, else from the last commit answered
/// before it was sent to the state before the first commit of a request sent after its answer.
pub(crate) fn expectations(
    records: &[Record],
    by_request: &HashMap<&str, &Event>,
    from_seq: i64,
    last_seq: i64,
) -> Vec<Expectation> {
    let committed: Vec<(u64, u64, i64)> = records
        .iter()
        .filter_map(|r| {
            let event = by_request.get(r.request_id.as_str())?;
            Some((r.sent_at, r.answered_at, event.seq))
        })
        .collect();
    let mut by_answer: Vec<(u64, i64)> = committed.iter().map(|c| (c.1, c.2)).collect();
    by_answer.sort();
    let mut prefix_max = Vec::with_capacity(by_answer.len());
    let mut max = from_seq;
    for (_, seq) in &by_answer {
        max = max.max(*seq);
        prefix_max.push(max);
    }
    let mut by_send: Vec<(u64, i64)> = committed.iter().map(|c| (c.0, c.2)).collect();
    by_send.sort();
    let mut suffix_min = vec![last_seq + 1; by_send.len() + 1];
    for i in (0..by_send.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(by_send[i].1);
    }
    let mut expectations = Vec::new();
    for (index, record) in records.iter().enumerate() {
        if record.replay_of.is_some() || record.status >= 500 {
            continue;
        }
        let (lo, hi) = match by_request.get(record.request_id.as_str()) {
            Some(event) if record.kind.mutates() => (event.seq - 1, event.seq - 1),
            _ => {
                let before = by_answer.partition_point(|(at, _)| *at < record.sent_at);
                let lo = if before == 0 {
                    from_seq
                } else {
                    prefix_max[before - 1]
                };
                let after = by_send.partition_point(|(at, _)| *at <= record.answered_at);
                (lo, suffix_min[after] - 1)
            }
        };
        expectations.push(Expectation {
            record: index,
            lo,
            hi,
            first_answer: None,
        });
    }
    expectations.sort_by_key(|e| e.lo);
    expectations
}

/// Checks, while the audit trail is replayed, that the model gives each record's answer in
/// one of the states of its window; reports every record for which it never does.
pub(crate) struct AnswerCheck<'a> {
    pub(crate) records: &'a [Record],
    pub(crate) pending: std::collections::VecDeque<Expectation>,
    pub(crate) active: Vec<(Expectation, Value)>,
    pub(crate) failures: Vec<String>,
}

impl<'a> AnswerCheck<'a> {
    pub(crate) fn new(records: &'a [Record], expectations: Vec<Expectation>) -> AnswerCheck<'a> {
        AnswerCheck {
            records,
            pending: expectations.into(),
            active: Vec::new(),
            failures: Vec::new(),
        }
    }

    pub(crate) fn observe(&mut self, model: &Model, seq: i64) {
        while self.pending.front().is_some_and(|e| e.lo <= seq) {
            let expectation = self.pending.pop_front().unwrap();
            let answer = observed(&self.records[expectation.record]);
            self.active.push((expectation, answer));
        }
        let records = self.records;
        let failures = &mut self.failures;
        self.active.retain_mut(|(expectation, observed)| {
            if expectation.hi < seq {
                failures.push(Self::failure(records, expectation, observed));
                return false;
            }
            if seq < expectation.lo {
                return true;
            }
            let record = &records[expectation.record];
            let answer = model.answer(record.kind, &record.request);
            let matched = answer == *observed;
            expectation.first_answer.get_or_insert(answer);
            !matched
        });
    }

    pub(crate) fn failure(
        records: &[Record],
        expectation: &Expectation,
        observed: &Value,
    ) -> String {
        let record = &records[expectation.record];
        format!(
            "{} {:?} {} {} {}: answered {observed}; in the states after events {}..={} the model answers {}",
            record.request_id,
            record.kind,
            record.request.method,
            record.request.path,
            record.request.body.as_deref().unwrap_or(""),
            expectation.lo,
            expectation.hi,
            expectation.first_answer.as_ref().map_or(
                "nothing (no state in the window)".to_owned(),
                Value::to_string
            )
        )
    }

    pub(crate) fn finish(mut self) -> Vec<String> {
        for (expectation, observed) in &self.active {
            self.failures
                .push(Self::failure(self.records, expectation, observed));
        }
        for expectation in &self.pending {
            let observed = observed(&self.records[expectation.record]);
            self.failures
                .push(Self::failure(self.records, expectation, &observed));
        }
        self.failures
    }
}

/// All mutations together (release, reclaim, placement, termination) must succeed often
/// enough too: a run that barely mutates anything proves little. A healthy run succeeds in
/// 40-55 % of them, and under load as few as 29 % (a loaded four-cell run drew 68 of 234:
/// which request meets a busy unit depends on the interleaving). The floor is judged as each
/// kind's is, against half the usual rate, so it does not fail a healthy run by chance.
pub(crate) const LOWEST_MUTATION_SUCCESS_RATE: f64 = 0.2;

/// Each kind of mutation must succeed often enough too, judged against the lowest success
/// rate a healthy run draws for it, about half the rate seen (CI's run of 480 operations:
/// placements ~25 %, units being often busy; releases ~30 %; reclaims ~90 %; terminations
/// ~45 %, many rightly refused). A kind of `n` requests with `s` successes fails when a
/// healthy run at that lowest rate `p` would succeed `s` times or fewer with a chance below
/// [`FLOOR_FALSE_ALARM`]: the binomial tail `P(X <= s)`, `X ~ Binomial(n, p)`. So the floor
/// grows with the run instead of being one percentage that small runs cannot be held to.
/// At CI's scale (~150 placements, ~90 releases, ~80 reclaims, ~45-50 terminations) a run
/// fails with at most 1 placement, 0 releases or 15 reclaims succeeding, and with no
/// termination once there are 49 (below that, none succeeding is that likely); at 4,000
/// operations the floors are about 7 %, 9 %, 35 % and 15 % of each kind's requests.
pub(crate) const LOWEST_SUCCESS_RATE: [(Kind, f64); 4] = [
    (Kind::Release, 0.15),
    (Kind::Reclaim, 0.45),
    (Kind::Place, 0.11),
    (Kind::Terminate, 0.25),
];
/// The chance, per kind and run, that a healthy run fails its floor on the draw alone.
pub(crate) const FLOOR_FALSE_ALARM: f64 = 1e-6;

/// `P(X <= k)` for `X ~ Binomial(n, p)`, summed in logarithms (exact enough for tails far
/// below 1e-6 with `n` in the hundreds of thousands).
pub(crate) fn binomial_at_most(k: usize, n: usize, p: f64) -> f64 {
    let (ln_p, ln_q) = (p.ln(), (1.0 - p).ln());
    let mut ln_choose = 0.0; // ln C(n, 0)
    let mut total = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        total += (ln_choose + i as f64 * ln_p + (n - i) as f64 * ln_q).exp();
    }
    total.min(1.0)
}

pub(crate) fn check_success_share(records: &[Record], verdict: &mut Verdict) {
    let mut total = (0, 0);
    for (kind, lowest_rate) in LOWEST_SUCCESS_RATE {
        let of_kind: Vec<&Record> = records
            .iter()
            .filter(|r| r.kind == kind && r.replay_of.is_none())
            .collect();
        let succeeded = of_kind
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .count();
        total = (total.0 + succeeded, total.1 + of_kind.len());
        let chance = binomial_at_most(succeeded, of_kind.len(), lowest_rate);
        verdict.check(chance >= FLOOR_FALSE_ALARM, || {
            format!(
                "only {succeeded} of {} {kind:?} requests succeeded: at a success rate of {lowest_rate} \
                 that many or fewer has a chance of {chance:.1e}",
                of_kind.len()
            )
        });
    }
    let (succeeded, judged) = total;
    let chance = binomial_at_most(succeeded, judged, LOWEST_MUTATION_SUCCESS_RATE);
    verdict.check(chance >= FLOOR_FALSE_ALARM, || {
        format!(
            "only {succeeded} of {judged} mutations succeeded: at a success rate of \
             {LOWEST_MUTATION_SUCCESS_RATE} that many or fewer has a chance of {chance:.1e}"
        )
    });
}

/// Every check of the invariants (docs/design.md) over the records of a run and the
/// database after it.
pub fn verify(
    app_db: &rusqlite::Connection,
    operator: &Client,
    records: &[Record],
    workload_from_seq: i64,
) -> Verdict {
    let mut verdict = verify_database(app_db, records, workload_from_seq);
    check_chains(operator, &mut verdict);
    verdict
}

/// [`verify`] but for the API's verification of the chains.
fn verify_database(
    app_db: &rusqlite::Connection,
    records: &[Record],
    workload_from_seq: i64,
) -> Verdict {
    let mut verdict = Verdict {
        operations: records.len(),
        retried: records.iter().filter(|r| r.retried > 0).count(),
        ..Verdict::default()
    };
    for record in records {
        *verdict
            .by_kind
            .entry(if record.twin {
                format!("{:?} (concurrent twin)", record.kind)
            } else {
                format!("{:?}", record.kind)
            })
            .or_default()
            .entry(record.status)
            .or_default() += 1;
    }
    check_responses(records, &mut verdict);
    let events = events(app_db);
    verdict.audit_events = events.len();
    check_audit_matches_responses(&events, records, workload_from_seq, &mut verdict);
    check_success_share(records, &mut verdict);
    let by_request: HashMap<&str, &Event> = events
        .iter()
        .filter(|e| e.seq > workload_from_seq)
        .map(|e| (e.request_id.as_str(), e))
        .collect();
    let last = events.last().map_or(0, |e| e.seq);
    let mut answers = AnswerCheck::new(
        records,
        expectations(records, &by_request, workload_from_seq, last),
    );
    let model = replay(app_db, &events, &mut verdict, |model, seq| {
        answers.observe(model, seq)
    });
    let failures = answers.finish();
    verdict.answers_checked = records.iter().filter(|r| r.replay_of.is_none()).count();
    for failure in failures {
        verdict.check(false, || failure);
    }
    check_responses_against_history(&model, app_db, records, &mut verdict);
    check_database(app_db, &model, &mut verdict);
    verdict
}

/// The API's verification of every chain: it holds, over every event replayed.
fn check_chains(operator: &Client, verdict: &mut Verdict) {
    let verification = operator.get("/v1/audit/verify").expect_status(200).json();
    verdict.check(verification["ok"] == true, || {
        format!("the audit chain does not verify: {verification}")
    });
    let replayed = verdict.audit_events as u64;
    verdict.check(
        verification["eventsChecked"].as_u64() == Some(replayed),
        || {
            format!(
                "verified {} of {replayed} events",
                verification["eventsChecked"]
            )
        },
    );
}

pub(crate) fn check_responses(records: &[Record], verdict: &mut Verdict) {
    let by_id: HashMap<&str, &Record> =
        records.iter().map(|r| (r.request_id.as_str(), r)).collect();
    for record in records {
        let what = format!(
            "{} {:?} {} {}{}",
            record.request_id, record.kind, record.request.method, record.base, record.request.path
        );
        verdict.check(record.status < 500, || {
            format!(
                "{what}: {} {}",
                record.status,
                String::from_utf8_lossy(&record.body)
            )
        });
        if record.status >= 400 {
            let problem = record.json();
            verdict.check(
                record.content_type.as_deref() == Some("application/problem+json")
                    && problem["code"].is_string()
                    && problem["status"] == record.status,
                || {
                    format!(
                        "{what}: not a problem document: {}",
                        String::from_utf8_lossy(&record.body)
                    )
                },
            );
        }
        if let Some(original) = &record.replay_of {
            let original = by_id[original.as_str()];
            verdict.check(
                record.replayed && record.status == original.status && record.body == original.body,
                || {
                    format!(
                        "{what}: replay of {} answered {} (replayed: {}) {}, first answer {} {}",
                        original.request_id,
                        record.status,
                        record.replayed,
                        String::from_utf8_lossy(&record.body),
                        original.status,
                        String::from_utf8_lossy(&original.body)
                    )
                },
            );
        } else {
            verdict.check(!record.replayed, || format!("{what}: answered as a replay"));
            verdict.check(
                record.kind.allowed_statuses().contains(&record.status),
                || {
                    format!(
                        "{what}: unexpected {} {}",
                        record.status,
                        String::from_utf8_lossy(&record.body)
                    )
                },
            );
        }
    }
}

/// One audit event per 2xx mutation, none for anything else, each of the right action.
pub(crate) fn check_audit_matches_responses(
    events: &[Event],
    records: &[Record],
    from_seq: i64,
    verdict: &mut Verdict,
) {
    let mut by_request: HashMap<&str, Vec<&Event>> = HashMap::new();
    for event in events.iter().filter(|e| e.seq > from_seq) {
        by_request
            .entry(event.request_id.as_str())
            .or_default()
            .push(event);
    }
    let mut matched = 0;
    for record in records {
        let found = by_request
            .remove(record.request_id.as_str())
            .unwrap_or_default();
        let should_write = record.kind.mutates() && (200..300).contains(&record.status);
        if should_write {
            matched += 1;
            verdict.check(
                found.len() == 1 && found[0].action == record.kind.audit_action(),
                || {
                    format!(
                        "{} {:?} {}: audit events {found:?}",
                        record.request_id, record.kind, record.status
                    )
                },
            );
        } else {
            verdict.check(found.is_empty(), || {
                format!(
                    "{} {:?} {} left audit events {found:?}",
                    record.request_id, record.kind, record.status
                )
            });
        }
    }
    verdict.check(by_request.is_empty(), || {
        format!("audit events of no request of the workload: {by_request:?}")
    });
    let workload_events = events.iter().filter(|e| e.seq > from_seq).count();
    verdict.check(workload_events == matched, || {
        format!("{workload_events} audit events for {matched} successful mutations")
    });
}

pub(crate) fn sorted_strings(value: &Value) -> Option<Vec<String>> {
    let mut list: Vec<String> = value
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    list.sort();
    Some(list)
}

/// Each 2xx answer agrees with the state history: release/reclaim answers show the released
/// set right after their commit and name the VMs the audit names; placements and
/// terminations are in the database as answered.
pub(crate) fn check_responses_against_history(
    model: &Model,
    db: &rusqlite::Connection,
    records: &[Record],
    verdict: &mut Verdict,
) {
    let events = events(db);
    let by_request: HashMap<&str, &Event> =
        events.iter().map(|e| (e.request_id.as_str(), e)).collect();
    for record in records
        .iter()
        .filter(|r| r.replay_of.is_none() && (200..300).contains(&r.status))
    {
        let body = record.json();
        let what = format!("{} {:?}", record.request_id, record.kind);
        match record.kind {
            Kind::Release | Kind::Reclaim => {
                if let Some(released) = sorted_strings(&body["releasedUnitIds"]) {
                    // None when the audit trail lacks the request's event (reported above).
                    let expected: Option<Vec<String>> = model
                        .released_after
                        .get(record.request_id.as_str())
                        .map(|units| units.iter().cloned().collect());
                    verdict.check(expected.as_ref() == Some(&released), || {
                        format!("{what}: answered released {released:?}, right after its commit it was {expected:?}")
                    });
                } else {
                    verdict.check(record.request.prefer_minimal, || {
                        format!("{what}: no releasedUnitIds")
                    });
                }
                if record.kind == Kind::Reclaim
                    && let Some(event) = by_request.get(record.request_id.as_str())
                {
                    verdict.check(
                        body["terminated"] == json!(event.terminated)
                            && body["skipped"] == json!(event.skipped),
                        || format!("{what}: answered {body}, audit says {event:?}"),
                    );
                    for vm in &event.terminated {
                        let reason: Option<String> = db
                            .query_row(
                                "SELECT termination_reason FROM vms WHERE id = ?",
                                [vm],
                                |r| r.get(0),
                            )
                            .unwrap_or(None);
                        verdict.check(reason.as_deref() == Some("reclaimed"), || {
                            format!(
                                "{what}: terminated {vm}, whose termination reason is {reason:?}"
                            )
                        });
                    }
                }
            }
            Kind::Place => {
                let id = body["id"].as_str().unwrap_or_default();
                let rows: Vec<(String, String, String)> = db
                    .prepare("SELECT org_id, node_id, tier FROM vms WHERE id = ?")
                    .unwrap()
                    .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let units: Vec<String> = db
                    .prepare("SELECT unit_id FROM vm_units WHERE vm_id = ? ORDER BY position")
                    .unwrap()
                    .query_map([id], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let expected = (
                    body["orgId"].as_str().unwrap_or_default().to_owned(),
                    body["nodeId"].as_str().unwrap_or_default().to_owned(),
                    body["tier"].as_str().unwrap_or_default().to_owned(),
                );
                verdict.check(rows == vec![expected.clone()], || {
                    format!("{what}: placed {expected:?}, the database has {rows:?}")
                });
                verdict.check(json!(units) == body["unitIds"], || {
                    format!(
                        "{what}: placed on {}, the database has {units:?}",
                        body["unitIds"]
                    )
                });
                let request: Value =
                    serde_json::from_str(record.request.body.as_deref().unwrap_or("null")).unwrap();
                verdict.check(
                    body["unitIds"] == request["unitIds"]
                        && body["tier"] == request["tier"]
                        && body["nodeId"] == request["nodeId"],
                    || format!("{what}: asked for {request}, got {body}"),
                );
                // The id is the server's, and the one the request's audit event names.
                let event = by_request.get(record.request_id.as_str());
                verdict.check(
                    id.starts_with("vm-") && event.is_some_and(|e| e.vm_id.as_deref() == Some(id)),
                    || format!("{what}: answered VM {id}, its audit event is {event:?}"),
                );
            }
            Kind::Terminate => {
                let id = body["id"].as_str().unwrap_or_default();
                let row: (String, Option<String>) = db
                    .query_row(
                        "SELECT status, termination_reason FROM vms WHERE id = ?",
                        [id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .unwrap();
                verdict.check(
                    row.0 == "terminated" && row.1.as_deref() == body["terminationReason"].as_str(),
                    || format!("{what}: answered {body}, the database has {row:?}"),
                );
                verdict.check(
                    model
                        .vms
                        .get(id)
                        .is_some_and(|vm| !vm.running && !vm.reclaimed),
                    || {
                        format!(
                            "{what}: the history does not show {id} stopped by this termination"
                        )
                    },
                );
            }
            _ => {}
        }
    }
}

/// The database agrees with the replayed history, and its own invariants hold.
pub(crate) fn check_database(db: &rusqlite::Connection, model: &Model, verdict: &mut Verdict) {
    let strings = |sql: &str| -> Vec<String> {
        db.prepare(sql)
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let doubly_used = strings(
        "SELECT node_id || '/' || unit_id FROM vm_units WHERE running = 1 \
         GROUP BY node_id, unit_id HAVING count(*) > 1",
    );
    verdict.check(doubly_used.is_empty(), || {
        format!("units running more than one VM: {doubly_used:?}")
    });
    let now = chrono::Utc::now().timestamp_millis();
    let non_spot_on_released = strings(&format!(
        "SELECT vu.vm_id FROM vm_units vu \
         JOIN reservation_units ru ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
         JOIN reservations r ON r.id = ru.reservation_id \
         WHERE vu.running = 1 AND vu.tier <> 'spot' AND ru.released = 1 AND r.state = 'live' \
           AND r.starts_at <= {now} AND (r.ends_at IS NULL OR r.ends_at > {now})"
    ));
    verdict.check(non_spot_on_released.is_empty(), || {
        format!("community/verified VMs on released units: {non_spot_on_released:?}")
    });
    let inconsistent = strings(
        "SELECT v.id FROM vms v WHERE \
         (v.status = 'running') <> EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id AND vu.running = 1) \
         OR NOT EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id) \
         OR EXISTS (SELECT 1 FROM vm_units vu WHERE vu.vm_id = v.id AND vu.running = 0) AND v.status = 'running' \
         OR (v.status = 'running') <> (v.termination_reason IS NULL AND v.terminated_at IS NULL)",
    );
    verdict.check(inconsistent.is_empty(), || {
        format!("VMs whose rows disagree with each other: {inconsistent:?}")
    });
    let journal: String = db
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    verdict.check(journal == "wal", || format!("journal mode is {journal}"));

    // The database is exactly the replayed history.
    for (id, r) in &model.reservations {
        let (state, units, released) = reservation_state(db, id);
        verdict.check(state == r.state, || {
            format!("{id}: state {state}, history says {}", r.state)
        });
        verdict.check(units == r.units, || {
            format!("{id}: units {units:?}, history says {:?}", r.units)
        });
        verdict.check(released == r.released, || {
            format!("{id}: released {released:?}, history says {:?}", r.released)
        });
    }
    for (id, vm) in &model.vms {
        let (status, reason): (String, Option<String>) = db
            .query_row(
                "SELECT status, termination_reason FROM vms WHERE id = ?",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        verdict.check((status == "running") == vm.running, || {
            format!("{id}: {status}, history says running={}", vm.running)
        });
        verdict.check(
            (reason.as_deref() == Some("reclaimed")) == vm.reclaimed,
            || {
                format!(
                    "{id}: reason {reason:?}, history says reclaimed={}",
                    vm.reclaimed
                )
            },
        );
    }
    let vm_count: i64 = db
        .query_row("SELECT count(*) FROM vms", [], |r| r.get(0))
        .unwrap();
    verdict.check(vm_count as usize == model.vms.len(), || {
        format!(
            "{vm_count} VMs stored, {} placed according to the audit trail",
            model.vms.len()
        )
    });
    for (node, units) in &model.nodes {
        let stored: BTreeSet<String> = db
            .prepare("SELECT unit_id FROM node_units WHERE node_id = ?")
            .unwrap()
            .query_map([node], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        verdict.check(&stored == units, || {
            format!("{node}: units {stored:?}, history says {units:?}")
        });
    }
}

/// A reservation's stored state, units and released units.
pub fn reservation_state(
    db: &rusqlite::Connection,
    id: &str,
) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let state: String = db
        .query_row("SELECT state FROM reservations WHERE id = ?", [id], |r| {
            r.get(0)
        })
        .unwrap();
    let mut units = BTreeSet::new();
    let mut released = BTreeSet::new();
    let mut statement = db
        .prepare("SELECT unit_id, released FROM reservation_units WHERE reservation_id = ?")
        .unwrap();
    let rows = statement
        .query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))
        .unwrap();
    for row in rows {
        let (unit, is_released) = row.unwrap();
        if is_released {
            released.insert(unit.clone());
        }
        units.insert(unit);
    }
    (state, units, released)
}

/// Where the trail of each cell of `app`'s market stands now (one number with one
/// database): the events after it belong to what runs next.
pub fn trail_marks(app: &App) -> Vec<i64> {
    (0..app.database_paths().len())
        .map(|cell| super::last_seq(&app.cell_db(cell)))
        .collect()
}

/// Every check of [`verify`] in each cell of `app`'s market, on the records of requests at
/// home there, from its mark in `marks` on. A node's cell holds everything the rules relate
/// it to, and nothing in one cell changes what a request in another may do or answer, so
/// each cell's own trail is the order its requests are replayed and judged in.
pub fn verify_cells(app: &App, records: &[Record], marks: &[i64]) -> Verdict {
    let operator = app.operator();
    let cells = app.cells();
    let mut verdict = Verdict::default();
    for (cell, mark) in marks.iter().enumerate() {
        let at_home: Vec<Record> = records
            .iter()
            .filter(|record| cells.home_of(&record.home()).index() == cell)
            .cloned()
            .collect();
        verdict.absorb(verify_database(&app.cell_db(cell), &at_home, *mark));
    }
    check_chains(&operator, &mut verdict);
    verdict
}

/// Checks a run's records from `marks` on ([`trail_marks`]), prints the verdict under
/// `title`, and fails on any violation.
#[track_caller]
pub fn verify_run(app: &App, records: &[Record], marks: &[i64], title: &str) {
    let verdict = verify_cells(app, records, marks);
    verdict.print(title);
    verdict.assert_clean();
}

/// Every host of `bases` answered at least one request of the run.
#[track_caller]
pub fn assert_every_host_served(records: &[Record], bases: &[String]) {
    for base in bases {
        let served = records.iter().filter(|r| &r.base == base).count();
        assert!(served > 0, "{base} served no request");
    }
}

/// Sets the market up through `app`, runs the seeded workload (`WORKLOAD_SEED`) against
/// `bases` with `threads` clients of `operations_per_thread` operations each
/// (`WORKLOAD_OPERATIONS` sets the whole run's size instead), and checks the run, reported
/// under `hosts`. Returns the run's records.
#[track_caller]
pub fn run_and_verify(
    app: &App,
    bases: &[String],
    threads: usize,
    operations_per_thread: usize,
    hosts: &str,
) -> Vec<Record> {
    let market = Market::setup(app);
    let marks = trail_marks(app);
    let seed = seed("WORKLOAD_SEED");
    let per_thread =
        scale("WORKLOAD_OPERATIONS", threads * operations_per_thread).div_ceil(threads);
    let records = super::run(&market, bases, threads, per_thread, seed);
    verify_run(
        app,
        &records,
        &marks,
        &format!("{hosts}, {threads} clients, seed {seed}"),
    );
    records
}
