//! A seeded, randomized, concurrent workload against the running app, and the checks that
//! prove from the database that it kept every promise of docs/design.md. Used by the
//! `concurrency`, `replicas` and `faults` suites.
//!
//! Many client threads release, reclaim, dry-run, place VMs of every tier as audience and
//! outsider orgs, terminate VMs, change node topologies, re-affirm reservations, try capacity
//! operations without the permission, and replay earlier requests with their
//! `Idempotency-Key`. Every request carries its own `X-Request-Id`, which the audit trail
//! records, so each 2xx mutation can be matched with exactly one audit event. The checks then
//! replay the audit trail in commit order through a model of the rules and compare the model,
//! every response and the database with each other.
//!
//! The model decides every answer, refusals included: a 2xx mutation must be what the model
//! allows in the state just before its audit event; any other answer (a refusal, a dry run)
//! must be exactly (status, code and the offending ids) what the model answers in one of the
//! states the request may have seen. Those are bounded by a logical clock that every send and
//! every answer ticks: the request saw at least every commit answered before it was sent, and
//! no commit of a request sent after it was answered. And a run where too few mutations
//! succeed fails: a server that refused everything would otherwise pass.

mod checks;
mod generate;
mod market;
mod model;

pub use checks::{
    Verdict, assert_every_host_served, reservation_state, run_and_verify, trail_marks, verify,
    verify_cells, verify_run,
};
pub use generate::{Kind, Record, Request, run, send};
pub use market::{
    AUDIENCE, Actor, EXTRA_UNIT, Market, NODE_UNITS, NODES, OUTSIDERS, RESERVED_UNITS,
};
pub use model::last_seq;
