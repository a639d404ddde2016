//! The audit trail: one event per mutation, appended in the mutation's own transaction, each
//! carrying a SHA-256 hash chained to the previous event's, so that editing, deleting or
//! reordering any event breaks the chain from there on.

use reservations_domain::Timestamp;
use reservations_domain::storage::{SqlValue, StorageError};
use reservations_domain::time::to_rfc3339;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::rows::{Row, exec, json_list, millis, placeholders, rows};
use crate::schema::text;
use crate::{Context, Page, Result, Store};

/// The hash the first event chains to.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Every action an event may record, as `GET /v1/audit?action=` accepts them.
pub const ACTIONS: &[&str] = &[
    "org.create",
    "apikey.create",
    "apikey.revoke",
    "node.create",
    "node.update",
    "reservation.create",
    "reservation.cancel",
    "reservation.reaffirm",
    "reservation.release",
    "reservation.reclaim",
    "vm.place",
    "vm.terminate",
];

/// What a mutation tells the trail about itself.
#[derive(Debug, Clone, Default)]
pub struct NewEvent<'a> {
    pub action: &'static str,
    pub node_id: Option<&'a str>,
    pub reservation_id: Option<&'a str>,
    pub vm_id: Option<&'a str>,
    pub org_id: Option<&'a str>,
    /// The object acted on when it is none of the above (e.g. an API key).
    pub subject_id: Option<&'a str>,
    pub unit_ids: &'a [String],
    pub terminated: &'a [String],
    pub skipped: &'a [String],
    pub reason: Option<&'a str>,
    /// Orgs whose keys (with `audit.read`) may read the event; operators read everything.
    pub visible_to: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub seq: i64,
    pub id: String,
    #[serde(serialize_with = "serialize_time")]
    pub at: Timestamp,
    pub actor_key_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_org_id: Option<String>,
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject_id: Option<String>,
    pub unit_ids: Vec<String>,
    pub terminated: Vec<String>,
    pub skipped: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub request_id: String,
    #[serde(skip)]
    pub visible_to: Vec<String>,
    pub prev_hash: String,
    pub hash: String,
}

fn serialize_time<S: serde::Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&to_rfc3339(*t))
}

impl AuditEvent {
    /// The hash of this event's content chained to `prev_hash`. The content is a JSON array
    /// in a fixed order, so the encoding is canonical.
    pub fn compute_hash(&self) -> String {
        let content = serde_json::json!([
            self.seq,
            self.id,
            self.at.timestamp_millis(),
            self.actor_key_id,
            self.actor_org_id,
            self.action,
            self.node_id,
            self.reservation_id,
            self.vm_id,
            self.org_id,
            self.subject_id,
            self.unit_ids,
            self.terminated,
            self.skipped,
            self.reason,
            self.request_id,
            self.visible_to,
        ]);
        let mut hasher = Sha256::new();
        hasher.update(self.prev_hash.as_bytes());
        hasher.update(b"\n");
        hasher.update(content.to_string().as_bytes());
        hex::encode(hasher.finalize())
    }
}

/// Which events to list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub node_id: Option<String>,
    pub reservation_id: Option<String>,
    pub action: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
    /// Only events visible to this org; `None` for operators.
    pub visible_to_org: Option<String>,
    /// List events after this sequence number.
    pub after_seq: Option<i64>,
    pub limit: usize,
}

/// The outcome of checking the whole chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainVerification {
    pub ok: bool,
    pub events_checked: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_broken_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_hash: Option<String>,
}

const COLUMNS: &str = "seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, \
     vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason, request_id, visible_to, \
     prev_hash, hash";

fn read_event(row: Row<'_>) -> Result<AuditEvent, StorageError> {
    Ok(AuditEvent {
        seq: row.int(0)?,
        id: row.text(1)?,
        at: row.time(2)?,
        actor_key_id: row.text(3)?,
        actor_org_id: row.opt_text(4)?,
        action: row.text(5)?,
        node_id: row.opt_text(6)?,
        reservation_id: row.opt_text(7)?,
        vm_id: row.opt_text(8)?,
        org_id: row.opt_text(9)?,
        subject_id: row.opt_text(10)?,
        unit_ids: row.string_list(11)?,
        terminated: row.string_list(12)?,
        skipped: row.string_list(13)?,
        reason: row.opt_text(14)?,
        request_id: row.text(15)?,
        visible_to: row.string_list(16)?,
        prev_hash: row.text(17)?,
        hash: row.text(18)?,
    })
}

impl Store<'_> {
    /// Appends an event. Must run inside the mutation's write transaction, which also makes
    /// reading the previous hash and writing the next one atomic.
    pub(crate) fn append_event(
        &self,
        ctx: &Context<'_>,
        event: NewEvent<'_>,
    ) -> Result<AuditEvent> {
        let last = exec(
            self.db(),
            "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
            &[],
        )?;
        let (prev_seq, prev_hash) = match rows(&last).next() {
            Some(row) => (row.int(0)?, row.text(1)?),
            None => (0, GENESIS_HASH.to_owned()),
        };
        let seq = prev_seq + 1;
        let mut visible_to = event.visible_to;
        if let Some(org) = &ctx.caller.org_id {
            visible_to.push(org.clone());
        }
        visible_to.sort();
        visible_to.dedup();
        let mut stored = AuditEvent {
            seq,
            id: format!("evt-{seq:010}"),
            at: ctx.now,
            actor_key_id: ctx.caller.key_id.clone(),
            actor_org_id: ctx.caller.org_id.clone(),
            action: event.action.to_owned(),
            node_id: event.node_id.map(str::to_owned),
            reservation_id: event.reservation_id.map(str::to_owned),
            vm_id: event.vm_id.map(str::to_owned),
            org_id: event.org_id.map(str::to_owned),
            subject_id: event.subject_id.map(str::to_owned),
            unit_ids: event.unit_ids.to_vec(),
            terminated: event.terminated.to_vec(),
            skipped: event.skipped.to_vec(),
            reason: event.reason.map(str::to_owned),
            request_id: ctx.request_id.to_owned(),
            visible_to,
            prev_hash,
            hash: String::new(),
        };
        stored.hash = stored.compute_hash();
        exec(
            self.db(),
            &format!(
                "INSERT INTO audit_events ({COLUMNS}) VALUES ({})",
                placeholders(19)
            ),
            &[
                SqlValue::Integer(stored.seq),
                text(&stored.id),
                millis(stored.at),
                text(&stored.actor_key_id),
                stored.actor_org_id.clone().into(),
                text(&stored.action),
                stored.node_id.clone().into(),
                stored.reservation_id.clone().into(),
                stored.vm_id.clone().into(),
                stored.org_id.clone().into(),
                stored.subject_id.clone().into(),
                json_list(&stored.unit_ids),
                json_list(&stored.terminated),
                json_list(&stored.skipped),
                stored.reason.clone().into(),
                text(&stored.request_id),
                json_list(&stored.visible_to),
                text(&stored.prev_hash),
                text(&stored.hash),
            ],
        )?;
        Ok(stored)
    }

    /// Events matching `filter`, oldest first, one page at a time.
    pub fn list_audit(&self, filter: &AuditFilter) -> Result<Page<AuditEvent>> {
        let mut conditions = vec!["seq > ?".to_owned()];
        let mut params = vec![SqlValue::Integer(filter.after_seq.unwrap_or(0))];
        let mut add = |condition: &str, value: SqlValue| {
            conditions.push(condition.to_owned());
            params.push(value);
        };
        if let Some(node) = &filter.node_id {
            add("node_id = ?", text(node));
        }
        if let Some(reservation) = &filter.reservation_id {
            add("reservation_id = ?", text(reservation));
        }
        if let Some(action) = &filter.action {
            add("action = ?", text(action));
        }
        if let Some(since) = filter.since {
            add("at >= ?", millis(since));
        }
        if let Some(until) = filter.until {
            add("at < ?", millis(until));
        }
        if let Some(org) = &filter.visible_to_org {
            add(
                "EXISTS (SELECT 1 FROM json_each(audit_events.visible_to) WHERE value = ?)",
                text(org),
            );
        }
        let limit = filter.limit.clamp(1, 1000);
        params.push(SqlValue::Integer(limit as i64 + 1));
        let result = exec(
            self.db(),
            &format!(
                "SELECT {COLUMNS} FROM audit_events WHERE {} ORDER BY seq LIMIT ?",
                conditions.join(" AND ")
            ),
            &params,
        )?;
        let items = rows(&result)
            .map(read_event)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_overfetched(items, limit, |e| e.seq.to_string()))
    }

    /// Recomputes every hash from the first event on and checks each link.
    pub fn verify_audit_chain(&self) -> Result<ChainVerification> {
        let mut expected_prev = GENESIS_HASH.to_owned();
        let mut expected_seq = 1;
        let mut checked = 0;
        loop {
            let result = exec(
                self.db(),
                &format!(
                    "SELECT {COLUMNS} FROM audit_events WHERE seq >= ? ORDER BY seq LIMIT 1000"
                ),
                &[SqlValue::Integer(expected_seq)],
            )?;
            if result.rows.is_empty() {
                break;
            }
            for row in rows(&result) {
                let event = read_event(row)?;
                checked += 1;
                let intact = event.seq == expected_seq
                    && event.prev_hash == expected_prev
                    && event.compute_hash() == event.hash;
                if !intact {
                    return Ok(ChainVerification {
                        ok: false,
                        events_checked: checked,
                        first_broken_seq: Some(expected_seq.min(event.seq)),
                        last_hash: None,
                    });
                }
                expected_prev = event.hash;
                expected_seq += 1;
            }
        }
        Ok(ChainVerification {
            ok: true,
            events_checked: checked,
            first_broken_seq: None,
            last_hash: (checked > 0).then_some(expected_prev),
        })
    }
}
