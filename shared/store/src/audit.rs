//! The audit trail: one event per mutation, appended in the mutation's own transaction, each
//! carrying a hash chained to the previous event's, so that editing, deleting or reordering
//! any event breaks the chain from there on.
//!
//! Hash versions: 1 (events written before schema 4) is SHA-256 over the previous hash and
//! the content; 2 is HMAC-SHA-256 keyed with the app's secret `audit_key`, so that rewriting
//! an event and recomputing its hash needs the key, not only write access to the database.

use std::collections::BTreeMap;

use crate::storage::{SqlValue, StorageError};
use hmac::{Hmac, Mac};
use reservations_domain::Timestamp;
use reservations_domain::audit::{AffectedVm, EventAudience, VmOwnerShare};
use reservations_domain::time::to_rfc3339;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::rows::{Row, exec, first_row, json_list, millis, placeholders, rows, text};

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
    /// Orgs whose keys (with `audit.read`) may read all of the event besides the acting org;
    /// operators read everything.
    pub visible_to: Vec<String>,
    /// VMs the event terminated: their orgs, if no principals, see only their own part.
    pub affected_vms: Vec<AffectedVm>,
    /// Deadlines the event gave VMs (a reclaim with notice, a release with `until`).
    pub deadlines: BTreeMap<String, Timestamp>,
    /// A release's end.
    pub release_until: Option<Timestamp>,
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
    /// The server's id of the request that made the event.
    pub request_id: String,
    /// The `x-request-id` the client sent, if any: the client's, unverified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// Orgs that see all of the event (see [`reservations_domain::audit`]).
    pub visible_to: Vec<String>,
    /// Orgs that see only their own terminated VMs.
    pub vm_owners: Vec<VmOwnerShare>,
    /// The deadlines the event gave VMs (`terminatesAt` by VM id): a reclaim with notice, a
    /// release with `until`.
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "serialize_times"
    )]
    pub deadlines: BTreeMap<String, Timestamp>,
    /// A release's `until`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_time"
    )]
    pub release_until: Option<Timestamp>,
    pub hash_version: i64,
    pub prev_hash: String,
    pub hash: String,
}

fn serialize_times<S: serde::Serializer>(
    times: &BTreeMap<String, Timestamp>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(times.len()))?;
    for (id, at) in times {
        map.serialize_entry(id, &to_rfc3339(*at))?;
    }
    map.end()
}

fn serialize_opt_time<S: serde::Serializer>(
    t: &Option<Timestamp>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&to_rfc3339(*t)),
        None => s.serialize_none(),
    }
}

/// The deadlines as the database keeps them: `{vmId: milliseconds}`.
fn deadlines_json(deadlines: &BTreeMap<String, Timestamp>) -> String {
    let millis: BTreeMap<&String, i64> = deadlines
        .iter()
        .map(|(id, at)| (id, at.timestamp_millis()))
        .collect();
    serde_json::to_string(&millis).expect("deadlines serialize")
}

fn serialize_time<S: serde::Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&to_rfc3339(*t))
}

/// The hash version new events are written with.
pub const HASH_VERSION: i64 = 2;

/// The hash version of events that gave deadlines or bound a release (issue 14): version 2's
/// content plus the deadlines and the release's end. Events without them stay version 2.
pub const HASH_VERSION_WITH_DEADLINES: i64 = 3;

impl AuditEvent {
    /// Who sees what of this event.
    pub fn audience(&self) -> EventAudience {
        EventAudience {
            principals: self.visible_to.clone(),
            vm_owners: self.vm_owners.clone(),
        }
    }

    /// The hash of this event's content chained to `prev_hash`, as its version computes it:
    /// `prevHash + "\n" + content` is hashed (version 1) or MACed with `audit_key` (version
    /// 2). `None` for a version this build does not know.
    pub fn compute_hash(&self, audit_key: &[u8]) -> Option<String> {
        let mut input = self.prev_hash.clone().into_bytes();
        input.push(b'\n');
        input.extend(self.content()?.to_string().into_bytes());
        match self.hash_version {
            1 => Some(hex::encode(Sha256::digest(&input))),
            _ => {
                let mut mac = Hmac::<Sha256>::new_from_slice(audit_key)
                    .expect("HMAC takes a key of any length");
                mac.update(&input);
                Some(hex::encode(mac.finalize().into_bytes()))
            }
        }
    }

    /// What the event's version hashes: a JSON array in a fixed order, so the encoding is
    /// canonical (the OpenAPI document's `AuditEvent.hash` spells it out for verifiers).
    fn content(&self) -> Option<serde_json::Value> {
        let mut content = serde_json::json!([
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
        ]);
        let fields = content.as_array_mut().expect("an array");
        match self.hash_version {
            1 => fields.push(serde_json::json!(self.visible_to)),
            2 | 3 => fields.extend([
                serde_json::json!(self.client_request_id),
                serde_json::json!(self.visible_to),
                serde_json::json!(self.vm_owners),
            ]),
            _ => return None,
        }
        if self.hash_version == 3 {
            let deadlines: serde_json::Value =
                serde_json::from_str(&deadlines_json(&self.deadlines)).expect("a JSON object");
            fields.extend([
                deadlines,
                serde_json::json!(self.release_until.map(|t| t.timestamp_millis())),
            ]);
        }
        Some(content)
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
    /// Only events this org sees something of (see [`reservations_domain::audit`]); `None`
    /// for operators. With a `reservation_id` filter, only those it is a principal of: an
    /// affected VM owner must not learn a reservation's id from its events.
    pub visible_to_org: Option<String>,
    /// List events after this sequence number.
    pub after_seq: Option<i64>,
    /// List events up to this sequence number (the feed reads the head first).
    pub up_to_seq: Option<i64>,
    /// Only these actions (empty: all; `action` narrows further).
    pub actions: &'static [&'static str],
    pub limit: usize,
}

/// The actions the events feed (`GET /v1/events`) carries: what happens to capacity and to
/// VMs on it.
pub const FEED_ACTIONS: &[&str] = &[
    "reservation.release",
    "reservation.reclaim",
    "vm.place",
    "vm.terminate",
];

/// One row of a listing: an event, or a row damaged so that it cannot be read (listed by its
/// sequence number so that the listing goes on; `verify` says what is wrong with it).
#[derive(Debug, Clone, PartialEq)]
pub enum Listed {
    Event(Box<AuditEvent>),
    Unreadable { seq: i64, error: String },
}

impl Listed {
    pub fn seq(&self) -> i64 {
        match self {
            Listed::Event(event) => event.seq,
            Listed::Unreadable { seq, .. } => *seq,
        }
    }
}

/// An event an operator pinned earlier (from a previous verification): the chain must still
/// hold it, unchanged, at the same place.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainPin {
    pub seq: i64,
    pub hash: String,
}

/// The outcome of checking the whole chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainVerification {
    pub ok: bool,
    pub events_checked: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_broken_seq: Option<i64>,
    /// Why the chain is broken, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The newest event's sequence number and hash: pin them, and a later verification
    /// given the pin also detects the deletion of events up to and including that one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_hash: Option<String>,
}

impl ChainVerification {
    fn broken(events_checked: i64, seq: i64, problem: String) -> ChainVerification {
        ChainVerification {
            ok: false,
            events_checked,
            first_broken_seq: Some(seq),
            problem: Some(problem),
            last_seq: None,
            last_hash: None,
        }
    }
}

const COLUMNS: &str = "seq, id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, \
     vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason, request_id, \
     client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash, deadlines, \
     release_until";
const COLUMN_COUNT: usize = 24;

fn read_event(row: Row<'_>) -> Result<AuditEvent, StorageError> {
    Ok(AuditEvent {
        seq: row.int("seq")?,
        id: row.text("id")?,
        at: row.time("at")?,
        actor_key_id: row.text("actor_key_id")?,
        actor_org_id: row.opt_text("actor_org_id")?,
        action: row.text("action")?,
        node_id: row.opt_text("node_id")?,
        reservation_id: row.opt_text("reservation_id")?,
        vm_id: row.opt_text("vm_id")?,
        org_id: row.opt_text("org_id")?,
        subject_id: row.opt_text("subject_id")?,
        unit_ids: row.string_list("unit_ids")?,
        terminated: row.string_list("terminated")?,
        skipped: row.string_list("skipped")?,
        reason: row.opt_text("reason")?,
        request_id: row.text("request_id")?,
        client_request_id: row.opt_text("client_request_id")?,
        visible_to: row.string_list("visible_to")?,
        vm_owners: row.json("vm_owners")?,
        deadlines: row
            .json::<BTreeMap<String, i64>>("deadlines")?
            .into_iter()
            .map(|(id, ms)| (id, reservations_domain::time::from_millis(ms)))
            .collect(),
        release_until: row.opt_time("release_until")?,
        hash_version: row.int("hash_version")?,
        prev_hash: row.text("prev_hash")?,
        hash: row.text("hash")?,
    })
}

/// The newest event of the chain: what the next one links to.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct ChainHead {
    pub seq: i64,
    pub hash: String,
}

/// A column `chain_head` with the [`ChainHead`] (NULL for an empty chain), for the statement
/// that reads what a mutation needs under the write lock, so that the link costs no
/// statement of its own.
pub(crate) const CHAIN_HEAD_COLUMN: &str = "(SELECT json_object('seq', seq, 'hash', hash) \
     FROM audit_events ORDER BY seq DESC LIMIT 1) AS chain_head";

pub(crate) fn read_chain_head(row: &Row<'_>) -> Result<Option<ChainHead>, StorageError> {
    row.opt_json("chain_head")
}

/// Where an event is inserted: the trail itself, or a view whose insert also applies the
/// change the event records (see migration 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recording {
    /// `audit_events`: the mutation wrote its own rows.
    Only,
    /// `capacity_changes`: the event of a release or reclaim, whose insert releases or
    /// reclaims the units, terminates the VMs it lists and touches the reservation.
    AppliesCapacityChange,
}

impl Store<'_> {
    /// Appends an event. Must run inside the mutation's write transaction, which also makes
    /// reading the previous hash and writing the next one atomic.
    pub(crate) fn append_event(
        &self,
        ctx: &Context<'_>,
        event: NewEvent<'_>,
    ) -> Result<AuditEvent> {
        let result = exec(self.db(), &format!("SELECT {CHAIN_HEAD_COLUMN}"), &[])?;
        let head = match first_row(&result) {
            Some(row) => read_chain_head(&row)?,
            None => None,
        };
        Ok(self.append_event_after(ctx, event, head, Recording::Only)?)
    }

    /// Appends an event after `head`, which the caller read inside the same write
    /// transaction.
    pub(crate) fn append_event_after(
        &self,
        ctx: &Context<'_>,
        event: NewEvent<'_>,
        head: Option<ChainHead>,
        recording: Recording,
    ) -> Result<AuditEvent, StorageError> {
        let (prev_seq, prev_hash) = match head {
            Some(head) => (head.seq, head.hash),
            None => (0, GENESIS_HASH.to_owned()),
        };
        let seq = prev_seq + 1;
        let audience = EventAudience::new(
            ctx.caller.org_id.as_deref(),
            event.visible_to,
            &event.affected_vms,
        );
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
            client_request_id: ctx.client_request_id.map(str::to_owned),
            visible_to: audience.principals,
            vm_owners: audience.vm_owners,
            hash_version: if event.deadlines.is_empty() && event.release_until.is_none() {
                HASH_VERSION
            } else {
                HASH_VERSION_WITH_DEADLINES
            },
            deadlines: event.deadlines,
            release_until: event.release_until,
            prev_hash,
            hash: String::new(),
        };
        stored.hash = stored
            .compute_hash(self.audit_key())
            .expect("the current hash version is known");
        exec(
            self.db(),
            &format!(
                "INSERT INTO {} ({COLUMNS}) VALUES ({})",
                match recording {
                    Recording::Only => "audit_events",
                    Recording::AppliesCapacityChange => "capacity_changes",
                },
                placeholders(COLUMN_COUNT)
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
                stored.client_request_id.clone().into(),
                json_list(&stored.visible_to),
                SqlValue::Text(serde_json::to_string(&stored.vm_owners).expect("shares serialize")),
                SqlValue::Integer(stored.hash_version),
                text(&stored.prev_hash),
                text(&stored.hash),
                SqlValue::Text(deadlines_json(&stored.deadlines)),
                stored.release_until.map(|t| t.timestamp_millis()).into(),
            ],
        )?;
        Ok(stored)
    }

    /// The newest event's sequence number (0 for an empty trail): one probe of the primary
    /// key, what a waiting feed reads between looks.
    pub fn latest_event_seq(&self) -> Result<i64> {
        let result = exec(
            self.db(),
            "SELECT COALESCE(MAX(seq), 0) AS seq FROM audit_events",
            &[],
        )?;
        Ok(match first_row(&result) {
            Some(row) => row.int("seq")?,
            None => 0,
        })
    }

    /// Events matching `filter`, oldest first, one page at a time.
    pub fn list_audit(&self, filter: &AuditFilter) -> Result<Page<Listed>> {
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
        if let Some(up_to) = filter.up_to_seq {
            add("seq <= ?", SqlValue::Integer(up_to));
        }

        if let Some(since) = filter.since {
            add("at >= ?", millis(since));
        }
        if let Some(until) = filter.until {
            add("at < ?", millis(until));
        }
        if let Some(org) = &filter.visible_to_org {
            let principal =
                "EXISTS (SELECT 1 FROM json_each(audit_events.visible_to) WHERE value = ?)";
            let vm_owner = "EXISTS (SELECT 1 FROM json_each(audit_events.vm_owners) \
                 WHERE json_extract(value, '$.orgId') = ?)";
            if filter.reservation_id.is_some() {
                add(principal, text(org));
            } else {
                conditions.push(format!("({principal} OR {vm_owner})"));
                params.push(text(org));
                params.push(text(org));
            }
        }
        if !filter.actions.is_empty() {
            conditions.push(format!(
                "action IN ({})",
                placeholders(filter.actions.len())
            ));
            params.extend(filter.actions.iter().map(|a| text(a)));
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
            .map(|row| {
                let seq = row.int("seq").unwrap_or_default();
                match read_event(row) {
                    Ok(event) => Listed::Event(Box::new(event)),
                    Err(e) => Listed::Unreadable {
                        seq,
                        error: e.to_string(),
                    },
                }
            })
            .collect();
        Ok(Page::from_overfetched(items, limit, |listed| {
            listed.seq().to_string()
        }))
    }

    /// Recomputes every hash from the first event on and checks each link, and that the
    /// chain still holds `pin` if one is given. A row that cannot be read breaks the chain
    /// there (it is reported, never an error).
    pub fn verify_audit_chain(&self, pin: Option<&ChainPin>) -> Result<ChainVerification> {
        let mut expected_prev = GENESIS_HASH.to_owned();
        let mut expected_seq = 1;
        let mut checked = 0;
        let mut pin_seen = false;
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
                checked += 1;
                let event = match read_event(row) {
                    Ok(event) => event,
                    Err(e) => {
                        return Ok(ChainVerification::broken(
                            checked,
                            expected_seq,
                            format!("event {expected_seq} cannot be read: {e}"),
                        ));
                    }
                };
                let problem = if event.seq != expected_seq {
                    Some(format!("event {expected_seq} is missing"))
                } else if event.prev_hash != expected_prev {
                    Some(format!(
                        "event {expected_seq} does not link to the one before it"
                    ))
                } else if event.compute_hash(self.audit_key()).as_ref() != Some(&event.hash) {
                    Some(format!(
                        "event {expected_seq}'s content does not match its hash"
                    ))
                } else if let Some(pin) = pin.filter(|pin| pin.seq == event.seq)
                    && pin.hash != event.hash
                {
                    Some(format!("event {} is not the pinned one", pin.seq))
                } else {
                    None
                };
                if let Some(problem) = problem {
                    return Ok(ChainVerification::broken(
                        checked,
                        expected_seq.min(event.seq),
                        problem,
                    ));
                }
                pin_seen |= pin.is_some_and(|pin| pin.seq == event.seq);
                expected_prev = event.hash;
                expected_seq += 1;
            }
        }
        if let Some(pin) = pin.filter(|_| !pin_seen) {
            return Ok(ChainVerification::broken(
                checked,
                pin.seq,
                format!("the pinned event {} is no longer in the chain", pin.seq),
            ));
        }
        Ok(ChainVerification {
            ok: true,
            events_checked: checked,
            first_broken_seq: None,
            problem: None,
            last_seq: (checked > 0).then_some(expected_seq - 1),
            last_hash: (checked > 0).then_some(expected_prev),
        })
    }
}
