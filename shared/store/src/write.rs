//! The write path (docs/design.md, "The write path"): a mutation reads its facts outside any
//! transaction, asks the domain for a plan, and writes the plan with **one** autocommit
//! statement, an insert into the view `writes` (schema/objects.sql). That statement holds the
//! database's write lock only while it runs on the primary, never across a round trip, and
//! no path holds it longer.
//!
//! What makes it safe without a transaction around the read: every fact a plan can depend on
//! (a node, a unit of a node, a reservation, a VM, an org, a key) has a version, moved by the
//! triggers of the tables whenever a write changes it. The read returns the versions of the
//! facts it read with the facts; the write statement carries them, and its trigger aborts
//! with `conflict: facts-moved` if any moved since. So two writes conflict only when one
//! changed what the other's plan read: releases of different units of one reservation, or
//! placements on different units of one node, commit side by side. On a conflict the request
//! reads and plans again after a short jittered wait; past [`WRITE_ATTEMPTS`] it is refused
//! as [`StoreError::Contention`] and nothing was written. The event needs nothing of its chain
//! when planned: the statement gives it its place, and seals the unsealed events before it
//! that the read saw (see [`crate::audit`]).
//!
//! A plan is written a plan at a time: [`Store::write`] takes one plan and answers what is
//! next ([`Written`]), so whoever carries the mutation out keeps the loop and every decision
//! in it (the request layer's executor, which also renders the answer a keyed request's
//! statement records; or [`Store::carry_out`] for the store's own mutations). Writes run only
//! where the database is the primary ([`Store::writable`]): an app at an edge site forwards
//! them home, and the statement returns the event's position, which the answer's bookmark
//! carries (see [`crate::site`]).
//!
//! The facts a plan reads and its statement moves are named by [`Fact`], as the schema's
//! triggers name them.

use crate::audit::{AuditEvent, Basis, NewEvent, visibility_json};
use crate::idempotency::{KeyedRequest, RETENTION_MS, StoredResponse};
use crate::storage::{Conflict, Guard, SqlValue, StorageError};
use crate::storage::{TransientFailures, WRITE_ATTEMPTS, conflict_backoff, is_transient};
use crate::storage::{exec, first_row, text};
use crate::{Context, Result, Store, StoreError};
use serde::Serialize;

/// The chain of a node's events: everything about the node, its reservations, their units
/// and the VMs on it.
pub fn node_chain(node_id: &str) -> String {
    format!("{NODE_CHAIN_PREFIX}{node_id}")
}

/// What a node's chain is named with, before the node's id.
pub const NODE_CHAIN_PREFIX: &str = "node:";

/// The chain of the events about orgs, their keys and operator keys.
pub const PLATFORM_CHAIN: &str = "platform";

/// A planned mutation: what the caller gets, and the write that makes it so (none when the
/// request changes nothing, e.g. revoking a revoked key, or for a dry run).
pub struct Planned<T> {
    pub outcome: T,
    pub write: Option<Write>,
}

impl<T> Planned<T> {
    pub fn new(outcome: T, write: Write) -> Planned<T> {
        Planned {
            outcome,
            write: Some(write),
        }
    }
}

/// One mutation as the write statement takes it.
pub struct Write {
    /// The chain the event joins, and what the plan was made on.
    pub(crate) chain: String,
    pub(crate) basis: Basis,
    pub(crate) event: NewEvent,
    pub(crate) changes: Changes,
    /// The domain's refusal for one of the database's own, should a guard refuse the write
    /// (a race the plan could not see, e.g. a VM placed on another node with the same id).
    pub(crate) refusal: Option<fn(&StorageError, &Changes) -> Option<StoreError>>,
}

impl Write {
    pub(crate) fn new(chain: String, basis: Basis, event: NewEvent, changes: Changes) -> Write {
        Write {
            chain,
            basis,
            event,
            changes,
            refusal: None,
        }
    }

    pub(crate) fn refusing(
        mut self,
        refusal: fn(&StorageError, &Changes) -> Option<StoreError>,
    ) -> Write {
        self.refusal = Some(refusal);
        self
    }
}

/// The plan as explicit lists, applied by the trigger of `writes` as they are: each list
/// says what to insert, update or delete, and nothing is derived there.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Changes {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub orgs: Vec<OrgRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<ApiKeyRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operator_keys: Vec<OperatorKeyRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub revoked_api_keys: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub revoked_operator_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_node: Option<NodeRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_update: Option<NodeRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed_node_units: Vec<String>,
    /// `[unitId, position]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_node_units: Vec<(String, i64)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<ReservationRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reservation_states: Vec<ReservationState>,
    /// Reservations whose `updated_at` becomes the event's time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub touched_reservations: Vec<String>,
    /// Reservations whose unit rows are all deleted (before `reservation_units` inserts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaced_reservation_units: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_units: Option<ReservationUnits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_units: Option<UnitsOfReservation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimed_units: Option<UnitsOfReservation>,
    /// VMs that stop now (or whose notice ran out and are written down).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ended_vms: Vec<EndedVm>,
    /// Running spot VMs given a deadline (an earlier one than any they had).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub noticed_vms: Vec<NoticedVm>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<VmRow>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct OrgRow {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApiKeyRow {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub role: String,
    /// The permission list as stored (JSON text), if the key has its own.
    pub permissions: Option<String>,
    pub secret_hash: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OperatorKeyRow {
    pub id: String,
    pub name: String,
    pub secret_hash: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeRow {
    pub owner_org_id: String,
    pub topology_gen: i64,
    pub unit_count: i64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReservationRow {
    pub id: String,
    pub starts_at: i64,
    pub ends_at: Option<i64>,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Vec<String>,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
    pub topology_gen: i64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReservationState {
    pub id: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_gen: Option<i64>,
}

/// A reservation's unit rows: `[position, unitId, released, releasedUntil]`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReservationUnits {
    pub reservation_id: String,
    pub units: Vec<(i64, String, bool, Option<i64>)>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UnitsOfReservation {
    pub reservation_id: String,
    pub unit_ids: Vec<String>,
    /// A release's end (releases only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct EndedVm {
    pub id: String,
    pub reason: &'static str,
    pub at: i64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NoticedVm {
    pub id: String,
    pub terminates_at: i64,
    pub reason: &'static str,
    /// The VM's units the notice is about, in the VM's order.
    pub unit_ids: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VmRow {
    pub id: String,
    pub org_id: String,
    pub tier: &'static str,
    pub unit_ids: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminates_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_reservation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_unit_ids: Option<Vec<String>>,
}

/// How far a write has come: its attempts so far and the transient failures met.
#[derive(Debug, Default)]
pub struct WriteAttempts {
    planned: u32,
    transient: TransientFailures,
}

impl WriteAttempts {
    /// After the read or the plan failed with `e`: `Ok` to plan again (a transient failure,
    /// waited for), else the failure to answer with.
    pub fn plan_failed(&mut self, e: StoreError) -> Result<()> {
        match self.transient.wait_to_retry(&e) {
            true => Ok(()),
            false => Err(e),
        }
    }
}

/// What is next for a write once its plan went to the database.
#[derive(Debug)]
pub enum Written<T> {
    /// Done: the outcome, which the database now holds (or, with nothing to write, the
    /// outcome as planned).
    Done(T),
    /// Plan again from fresh facts: a fact the plan read moved (the backoff waited), or the
    /// statement failed in a way that did not land.
    PlanAgain,
}

impl Store<'_> {
    /// Carries out a mutation whose plan `plan` makes from fresh facts, with no idempotency
    /// record: plan, write, and plan again while its facts move (see the module's comment).
    /// Requests run the same steps in the request layer, which records their answers.
    pub(crate) fn carry_out<T>(
        &self,
        ctx: &Context<'_>,
        mut plan: impl FnMut() -> Result<Planned<T>>,
    ) -> Result<T> {
        self.writable()?;
        let mut attempts = WriteAttempts::default();
        loop {
            let planned = match plan() {
                Ok(planned) => planned,
                Err(e) => {
                    attempts.plan_failed(e)?;
                    continue;
                }
            };
            match self.write(ctx, planned, None, &mut attempts)? {
                Written::Done(outcome) => return Ok(outcome),
                Written::PlanAgain => {}
            }
        }
    }

    /// Refuses any write where the database may be a read replica, before anything is read
    /// for it: a replica forwards write statements one by one, and writes run at home,
    /// beside the primary (docs/design.md, "Writes at home").
    pub fn writable(&self) -> Result<()> {
        match self.copy_may_lag() {
            false => Ok(()),
            true => Err(StoreError::Storage(StorageError::Unavailable(
                "this app's database may be a read replica, and writes run only beside the \
                 primary: give this app home_url, the base URL of the app there"
                    .into(),
            ))),
        }
    }

    /// Writes `planned` with one statement, recording `record` (a keyed request's answer)
    /// with it. A statement whose answer was lost is looked for before anything else, so a
    /// write is never applied twice. Refused as [`StoreError::AlreadyRecorded`] when the
    /// request's key was recorded meanwhile, and as [`StoreError::Contention`] past
    /// [`WRITE_ATTEMPTS`] plans.
    pub fn write<T>(
        &self,
        ctx: &Context<'_>,
        planned: Planned<T>,
        record: Option<(&KeyedRequest<'_>, StoredResponse)>,
        attempts: &mut WriteAttempts,
    ) -> Result<Written<T>> {
        let Planned { outcome, write } = planned;
        let Some(write) = write else {
            self.write_attempts.set(attempts.planned + 1);
            return Ok(Written::Done(outcome));
        };
        attempts.planned += 1;
        self.write_attempts.set(attempts.planned);
        let event = self.new_event(ctx, &write.chain, &write.basis, &write.event);
        let place = EventPlace {
            chain: write.chain.clone(),
            after: write.basis.head,
            id: event.id.clone(),
            hash: event.hash.clone(),
        };
        let turn = self.write_turn(ctx)?;
        crate::storage::Tally::write_tried();
        let applied = self.apply(ctx, &event, &write, record);
        drop(turn);
        let storage = match applied {
            Ok(position) => {
                self.seen.at_least(position);
                return Ok(Written::Done(outcome));
            }
            Err(storage) => storage,
        };
        match storage {
            StorageError::Conflict(Conflict::KeyRecorded, _) => {
                return Err(StoreError::AlreadyRecorded);
            }
            StorageError::Conflict(Conflict::FactsMoved, _)
                if attempts.planned < WRITE_ATTEMPTS =>
            {
                std::thread::sleep(conflict_backoff(attempts.planned));
                return Ok(Written::PlanAgain);
            }
            StorageError::Conflict(Conflict::FactsMoved, _) => {
                return Err(StoreError::Contention {
                    attempts: attempts.planned,
                });
            }
            StorageError::Busy(_)
            | StorageError::Unavailable(_)
            | StorageError::Unanswered(_)
            | StorageError::Refused(..)
            | StorageError::Constraint(_)
            | StorageError::Behind(..)
            | StorageError::Other(_) => {}
        }
        let refused = write
            .refusal
            .and_then(|refusal| refusal(&storage, &write.changes))
            .or_else(|| key_refusal(&storage));
        let e = StoreError::Storage(storage);
        if attempts.transient.wait_to_retry(&e) {
            // The answer may have been lost after the commit: look before planning again.
            loop {
                match self.landed(&place) {
                    Ok(true) => return Ok(Written::Done(outcome)),
                    Ok(false) => return Ok(Written::PlanAgain),
                    Err(e) if attempts.transient.wait_to_retry(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // Out of retries, the caller hears that nothing changed: look once more that
        // nothing did.
        if is_transient(&e) && matches!(self.landed(&place), Ok(true)) {
            return Ok(Written::Done(outcome));
        }
        Err(refused.unwrap_or(e))
    }

    /// Whether the event of `place` is there, as that write hashed it: after the chain's
    /// head the write was planned on.
    fn landed(&self, place: &EventPlace) -> Result<bool> {
        let result = exec(
            self.db(),
            "SELECT 1 AS landed FROM audit_events INDEXED BY audit_by_place \
             WHERE chain = ? AND chain_seq > ? AND id = ? AND hash = ?",
            &[
                text(&place.chain),
                SqlValue::Integer(place.after),
                text(&place.id),
                text(&place.hash),
            ],
        )?;
        Ok(!result.rows.is_empty())
    }

    /// The one write statement, of the event `event` sealed for `write`.
    /// Returns the event's position (see [`crate::site`]), as the primary gave it.
    fn apply(
        &self,
        ctx: &Context<'_>,
        event: &AuditEvent,
        write: &Write,
        record: Option<(&KeyedRequest<'_>, StoredResponse)>,
    ) -> Result<i64, StorageError> {
        let changes = serde_json::to_string(&write.changes).expect("changes serialize");
        let facts = serde_json::to_string(&write.basis.facts).expect("facts serialize");
        let seals = serde_json::to_string(&self.seals_for(&write.basis)).expect("seals serialize");
        // The columns of `writes` (schema/objects.sql), each named beside its value; a column
        // left out is NULL (no idempotency record).
        let mut columns = event.columns();
        columns.extend([
            ("facts", SqlValue::Text(facts)),
            ("seals", SqlValue::Text(seals)),
            ("changes", SqlValue::Text(changes)),
            (
                "audience",
                SqlValue::Text(visibility_json(&event.audience())),
            ),
            ("caller_key_id", text(&ctx.caller.key_id)),
            (
                "schema_version",
                SqlValue::Integer(crate::schema::LATEST_VERSION),
            ),
        ]);
        if let Some((request, response)) = record {
            let response = serde_json::to_string(&response).expect("a response serializes");
            let expires_at = request.now.timestamp_millis().saturating_add(RETENTION_MS);
            columns.extend([
                ("record_caller_key_id", text(request.caller_key_id)),
                ("record_key", text(request.idempotency_key)),
                ("record_fingerprint", text(&request.fingerprint)),
                ("record_response", SqlValue::Text(response)),
                ("record_expires_at", SqlValue::Integer(expires_at)),
            ]);
        }
        let (names, mut params): (Vec<&str>, Vec<SqlValue>) = columns.into_iter().unzip();
        params.push(text(&event.chain));
        // The event just placed is its chain's newest: nothing else writes in between.
        let result = self.db().execute(
            &format!(
                "INSERT INTO writes ({}) VALUES ({}) \
                 RETURNING (SELECT seq FROM audit_events INDEXED BY audit_by_place \
                            WHERE chain = ? ORDER BY chain_seq DESC LIMIT 1) AS position",
                names.join(", "),
                crate::storage::placeholders(names.len())
            ),
            &params,
        )?;
        match first_row(&result) {
            Some(row) => row.int("position"),
            None => Err(StorageError::Other(
                "the write statement returned no position".into(),
            )),
        }
    }
}

/// A write's event, by its chain, the chain's head it was planned after, its id and the hash
/// it was written with (unique to that write).
struct EventPlace {
    chain: String,
    after: i64,
    id: String,
    hash: String,
}

/// The refusal of a write whose caller's key was revoked after the request was authenticated
/// (the write statement checks the key at the primary).
fn key_refusal(error: &StorageError) -> Option<StoreError> {
    (Guard::of(error) == Some(Guard::KeyRevoked)).then_some(StoreError::KeyRevoked)
}

// ============================================================================================
// The facts a write moves
//
// The facts a plan reads and a write moves, each named as `fact_versions` keys it (the
// triggers of schema/objects.sql name the same facts the same way). Every argument is an
// SQL expression: a parameter, a column or a literal.
//
// A node's facts are named after the node first, so that the facts one write moves (its
// node, units, reservations and VMs) are neighbours in `fact_versions`: one page of it
// changes, not one per kind of fact.

/// A fact, by its `fact_versions` key.
pub(crate) struct Fact;

impl Fact {
    /// A node: its owner, topology and units.
    pub(crate) fn node(node: &str) -> String {
        format!("json_array('node', {node})")
    }

    /// A unit of a node: who may use it (its reservations' claims and releases, the VM on it).
    pub(crate) fn unit(node: &str, unit: &str) -> String {
        format!("json_array('node', {node}, 'unit', {unit})")
    }

    /// A reservation on a node: its state and term.
    pub(crate) fn reservation(node: &str, reservation: &str) -> String {
        format!("json_array('node', {node}, 'reservation', {reservation})")
    }

    /// A VM on a node: its state and deadline.
    pub(crate) fn vm(node: &str, vm: &str) -> String {
        format!("json_array('node', {node}, 'vm', {vm})")
    }

    /// An org.
    pub(crate) fn org(org: &str) -> String {
        format!("json_array('org', {org})")
    }

    /// An org's set of live keys, moved whenever one of them is created or revoked.
    pub(crate) fn org_keys(org: &str) -> String {
        format!("json_array('org-keys', {org})")
    }

    /// A key (an org's or an operator's).
    pub(crate) fn key(key: &str) -> String {
        format!("json_array('key', {key})")
    }
}

#[cfg(test)]
mod fact_tests {
    use super::*;

    /// The fact a trigger's `json_array(…)` names, as this module names it with the same
    /// arguments; `None` for a shape it does not name.
    fn named_here(expression: &str) -> Option<String> {
        let inner = expression.strip_prefix("json_array(")?.strip_suffix(')')?;
        let arguments: Vec<&str> = inner.split(", ").collect();
        Some(match arguments.as_slice() {
            ["'node'", n] => Fact::node(n),
            ["'node'", n, "'unit'", u] => Fact::unit(n, u),
            ["'node'", n, "'reservation'", r] => Fact::reservation(n, r),
            ["'node'", n, "'vm'", v] => Fact::vm(n, v),
            ["'org'", o] => Fact::org(o),
            ["'org-keys'", o] => Fact::org_keys(o),
            ["'key'", k] => Fact::key(k),
            _ => return None,
        })
    }

    /// Every `json_array(…)` a statement of `sql` names a fact by: the values of an insert into
    /// `fact_moves`, and what a `DELETE FROM fact_versions` compares `fact` with.
    fn facts_named_in(sql: &str) -> Vec<&str> {
        let moved = sql
            .lines()
            .filter_map(|line| line.split_once("INSERT INTO fact_moves (fact) VALUES ("))
            .map(|(_, rest)| rest.trim_end().trim_end_matches(';'))
            .map(|values| values.strip_suffix(')').unwrap_or(values));
        let dropped = sql
            .lines()
            .filter_map(|line| line.split_once("DELETE FROM fact_versions WHERE fact = "))
            .map(|(_, rest)| rest.trim_end().trim_end_matches(';'));
        moved.chain(dropped).collect()
    }

    #[test]
    fn the_schema_s_triggers_name_each_fact_as_the_plans_do() {
        let named = facts_named_in(crate::schema::OBJECTS);
        assert!(
            named.len() >= 8,
            "the triggers that move or drop facts: {named:?}"
        );
        assert!(
            named.iter().any(|fact| fact.contains("'vm', NEW.id")),
            "the version an ended VM drops is among them: {named:?}"
        );
        for expression in named {
            assert_eq!(
                named_here(expression).as_deref(),
                Some(expression),
                "a trigger names a fact as Fact does not"
            );
        }
    }

    #[test]
    fn a_fact_named_otherwise_is_told() {
        let sql = "    DELETE FROM fact_versions WHERE fact = json_array('vm', NEW.id);\n\
                   INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.id, 'unit'));";
        for expression in facts_named_in(sql) {
            assert_eq!(named_here(expression), None, "{expression}");
        }
    }
}
