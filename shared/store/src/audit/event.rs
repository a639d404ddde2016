//! The audit event itself: what a mutation tells the trail ([`NewEvent`]), the event as it is
//! kept and listed ([`AuditEvent`]), the content its hash is a MAC over, the seal that links
//! it into its chain ([`seal_link`]), and its row of `audit_events`, written and read; and
//! what a write reads of its chain to be sealed on ([`Basis`]).

use crate::storage::{Row, json_list, millis, text};
use crate::storage::{SqlValue, StorageError};
use crate::{Context, Result, Store};
use hmac::{Hmac, Mac};
use reservations_domain::Timestamp;
use reservations_domain::audit::{AffectedVm, EventAudience, VmOwnerShare};
use reservations_domain::time::to_rfc3339;
use serde::Deserialize;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

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
pub struct NewEvent {
    pub action: &'static str,
    pub node_id: Option<String>,
    pub reservation_id: Option<String>,
    pub vm_id: Option<String>,
    pub org_id: Option<String>,
    /// The object acted on when it is none of the above (e.g. an API key).
    pub subject_id: Option<String>,
    pub unit_ids: Vec<String>,
    pub terminated: Vec<String>,
    pub skipped: Vec<String>,
    pub reason: Option<String>,
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
    /// The chain the event belongs to, and its place there (from 1).
    pub chain: String,
    pub chain_seq: i64,
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
    /// The newest place of the chain the writer had seen (version 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<i64>,
    /// The event's link to everything before it in its chain, once a later write sealed it
    /// (version 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
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
pub(crate) fn deadlines_json(deadlines: &BTreeMap<String, Timestamp>) -> String {
    let millis: BTreeMap<&String, i64> = deadlines
        .iter()
        .map(|(id, at)| (id, at.timestamp_millis()))
        .collect();
    serde_json::to_string(&millis).expect("deadlines serialize")
}

fn serialize_time<S: serde::Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&to_rfc3339(*t))
}

/// The hash version new events are written with: keyed on their own content, numbered by
/// the write statement and sealed by the writes that follow.
pub const HASH_VERSION: i64 = 5;

/// The keyed version chained at write time (the previous hash and the place in the MAC):
/// events written so before, and the earlier builds' events sealed again.
pub const CHAINED_HASH_VERSION: i64 = 4;

/// The chain of the events written before each node had its own; no event joins it now.
pub const TRAIL_CHAIN: &str = "trail";

impl AuditEvent {
    /// Who sees what of this event.
    pub fn audience(&self) -> EventAudience {
        EventAudience {
            principals: self.visible_to.clone(),
            vm_owners: self.vm_owners.clone(),
        }
    }

    /// The event's MAC with `audit_key`: for version 5 over its content, for version 4 over
    /// `prevHash + "\n" + content`. `None` for earlier versions: their events are sealed
    /// again when the schema is migrated (see [`super::seal`]).
    pub fn compute_hash(&self, audit_key: &[u8]) -> Option<String> {
        let input = match self.hash_version {
            HASH_VERSION => self.content()?.to_string().into_bytes(),
            CHAINED_HASH_VERSION => {
                let mut input = self.prev_hash.clone().into_bytes();
                input.push(b'\n');
                input.extend(self.content()?.to_string().into_bytes());
                input
            }
            _ => return None,
        };
        Some(mac(audit_key, &input))
    }

    /// What the event hashes: a JSON array in a fixed order, so the encoding is canonical
    /// (the OpenAPI document's `AuditEvent.hash` spells it out for verifiers): the chain,
    /// then `afterSeq` (version 5) or `chainSeq` (version 4), then the content.
    fn content(&self) -> Option<serde_json::Value> {
        let position = match self.hash_version {
            HASH_VERSION => serde_json::json!(self.after_seq?),
            CHAINED_HASH_VERSION => serde_json::json!(self.chain_seq),
            _ => return None,
        };
        let deadlines: serde_json::Value =
            serde_json::from_str(&deadlines_json(&self.deadlines)).expect("a JSON object");
        Some(serde_json::json!([
            self.chain,
            position,
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
            self.client_request_id,
            self.visible_to,
            self.vm_owners,
            deadlines,
            self.release_until.map(|t| t.timestamp_millis()),
        ]))
    }

    /// What a later event's seal links to: this event's seal (version 5) or its hash, which
    /// chains everything before it (version 4).
    pub(super) fn link(&self) -> Option<&str> {
        match self.hash_version {
            HASH_VERSION => self.seal.as_deref(),
            _ => Some(&self.hash),
        }
    }

    /// The event's columns of `writes`, each named beside its value.
    pub(crate) fn columns(&self) -> Vec<(&'static str, SqlValue)> {
        vec![
            ("id", text(&self.id)),
            ("at", millis(self.at)),
            ("actor_key_id", text(&self.actor_key_id)),
            ("actor_org_id", self.actor_org_id.clone().into()),
            ("action", text(&self.action)),
            ("node_id", self.node_id.clone().into()),
            ("reservation_id", self.reservation_id.clone().into()),
            ("vm_id", self.vm_id.clone().into()),
            ("org_id", self.org_id.clone().into()),
            ("subject_id", self.subject_id.clone().into()),
            ("unit_ids", json_list(&self.unit_ids)),
            ("terminated", json_list(&self.terminated)),
            ("skipped", json_list(&self.skipped)),
            ("reason", self.reason.clone().into()),
            ("request_id", text(&self.request_id)),
            ("client_request_id", self.client_request_id.clone().into()),
            ("visible_to", json_list(&self.visible_to)),
            (
                "vm_owners",
                SqlValue::Text(serde_json::to_string(&self.vm_owners).expect("shares serialize")),
            ),
            ("hash_version", SqlValue::Integer(self.hash_version)),
            ("hash", text(&self.hash)),
            ("deadlines", SqlValue::Text(deadlines_json(&self.deadlines))),
            (
                "release_until",
                self.release_until.map(|t| t.timestamp_millis()).into(),
            ),
            ("chain", text(&self.chain)),
            ("after_seq", self.after_seq.into()),
        ]
    }
}

/// Who sees an event, as the rows of `audit_visibility` the listings by need to know walk:
/// `[[orgId, 1], ...]` for the principals (the whole event) and `[orgId, 0]` for the owners
/// of VMs it terminated (their own part).
pub(crate) fn visibility_json(audience: &EventAudience) -> String {
    let rows: Vec<(&str, i64)> = audience
        .principals
        .iter()
        .map(|org| (org.as_str(), 1))
        .chain(
            audience
                .vm_owners
                .iter()
                .map(|share| (share.org_id.as_str(), 0)),
        )
        .collect();
    serde_json::to_string(&rows).expect("visibility serializes")
}

/// A new event's id: random, so that a write whose answer was lost can look for its own
/// event (and no other write's) before it is planned again.
fn new_event_id() -> String {
    let random = format!(
        "{:016x}{:016x}",
        crate::storage::random_below(u64::MAX),
        crate::storage::random_below(u64::MAX)
    );
    let digest = Sha256::digest(random);
    format!("evt-{}", &hex::encode(digest)[..20])
}

fn mac(audit_key: &[u8], input: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(audit_key).expect("HMAC takes a key of any length");
    mac.update(input);
    hex::encode(mac.finalize().into_bytes())
}

/// The seal of the event at `chain_seq` with hash `hash`, following the event whose link
/// (its seal, or for version 4 its hash) is `before` ([`GENESIS_HASH`] for the first).
pub fn seal_link(audit_key: &[u8], before: &str, chain_seq: i64, hash: &str) -> String {
    mac(
        audit_key,
        format!("seal\n{before}\n{chain_seq}\n{hash}").as_bytes(),
    )
}

/// The columns every event has had since each node has its own chain.
macro_rules! columns_written_since_chains_per_node {
    () => {
        "e.seq AS seq, e.chain AS chain, e.chain_seq AS chain_seq, e.id AS id, \
     e.at AS at, e.actor_key_id AS actor_key_id, e.actor_org_id AS actor_org_id, \
     e.action AS action, e.node_id AS node_id, e.reservation_id AS reservation_id, \
     e.vm_id AS vm_id, e.org_id AS org_id, e.subject_id AS subject_id, e.unit_ids AS unit_ids, \
     e.terminated AS terminated, e.skipped AS skipped, e.reason AS reason, \
     e.request_id AS request_id, e.client_request_id AS client_request_id, \
     e.visible_to AS visible_to, e.vm_owners AS vm_owners, e.hash_version AS hash_version, \
     e.prev_hash AS prev_hash, e.hash AS hash, e.deadlines AS deadlines, \
     e.release_until AS release_until"
    };
}

/// The columns of an event, of `audit_events e`.
pub(crate) const COLUMNS: &str = concat!(
    columns_written_since_chains_per_node!(),
    ", e.after_seq AS after_seq, e.seal AS seal"
);

/// The columns of an event as a schema before version 15 has them, for the sealing of
/// earlier builds' events, which runs at schema 10 (no event of those is of version 5).
pub(crate) const COLUMNS_BEFORE_SEALS: &str = concat!(
    columns_written_since_chains_per_node!(),
    ", NULL AS after_seq, NULL AS seal"
);

/// A hash column: 64 lowercase hex digits, or the row cannot be read.
fn read_hash(row: &Row<'_>, column: &str) -> Result<String, StorageError> {
    let hash = row.text(column)?;
    if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(hash)
    } else {
        Err(StorageError::Other(
            format!("column {column}: not a hash of 64 hex digits").into(),
        ))
    }
}

pub(crate) fn read_event(row: Row<'_>) -> Result<AuditEvent, StorageError> {
    Ok(AuditEvent {
        seq: row.int("seq")?,
        chain: row.text("chain")?,
        chain_seq: row.int("chain_seq")?,
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
        prev_hash: read_hash(&row, "prev_hash")?,
        hash: read_hash(&row, "hash")?,
        after_seq: row.opt_int("after_seq")?,
        seal: match row.opt_text("seal")? {
            Some(_) => Some(read_hash(&row, "seal")?),
            None => None,
        },
    })
}

impl Store<'_> {
    /// The event as a write planned on `basis` appends it to `chain`, hashed; its place and
    /// `prevHash` are the write statement's to give.
    pub(crate) fn new_event(
        &self,
        ctx: &Context<'_>,
        chain: &str,
        basis: &Basis,
        event: &NewEvent,
    ) -> AuditEvent {
        let audience = EventAudience::new(
            ctx.caller.org_id.as_deref(),
            event.visible_to.clone(),
            &event.affected_vms,
        );
        let mut sealed = AuditEvent {
            seq: 0,
            chain: chain.to_owned(),
            chain_seq: 0,
            id: new_event_id(),
            at: ctx.now,
            actor_key_id: ctx.caller.key_id.clone(),
            actor_org_id: ctx.caller.org_id.clone(),
            action: event.action.to_owned(),
            node_id: event.node_id.clone(),
            reservation_id: event.reservation_id.clone(),
            vm_id: event.vm_id.clone(),
            org_id: event.org_id.clone(),
            subject_id: event.subject_id.clone(),
            unit_ids: event.unit_ids.clone(),
            terminated: event.terminated.clone(),
            skipped: event.skipped.clone(),
            reason: event.reason.clone(),
            request_id: ctx.request_id.to_owned(),
            client_request_id: ctx.client_request_id.map(str::to_owned),
            visible_to: audience.principals,
            vm_owners: audience.vm_owners,
            deadlines: event.deadlines.clone(),
            release_until: event.release_until,
            hash_version: HASH_VERSION,
            prev_hash: String::new(),
            hash: String::new(),
            after_seq: Some(basis.head),
            seal: None,
        };
        sealed.hash = sealed
            .compute_hash(self.audit_key())
            .expect("the current hash version is known");
        sealed
    }
}

// ============================================================================================
// The basis an event is sealed on
//
// What a write reads of its chain, in the same statement as its facts: the [`Basis`] it
// is planned on (the versions of the facts it read, the chain's head and its unsealed
// tail), and the seals of that tail the write adds.

/// How many unsealed events of its chain one write seals at most.
const SEALS_PER_WRITE: i64 = 64;

/// What a write was planned on, read with its facts in the same statement: the version of
/// every fact the plan read, which the write statement checks, and the chain's unsealed tail,
/// which the write seals.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct Basis {
    /// `[fact, version]` for every fact the plan read (0: never written).
    pub facts: Vec<(String, i64)>,
    /// The newest place of the chain (0 for an empty chain).
    pub head: i64,
    /// The oldest unsealed events of the chain, `[chainSeq, hash]` in order.
    pub unsealed: Vec<(i64, String)>,
    /// The link of the event before the first unsealed one (none when that is the first).
    pub before: Option<String>,
}

/// A column `basis` with the [`Basis`] of a write on the chain named by `chain` (an SQL
/// expression), for the facts named by `facts`, a query of one column `fact` (each fact as
/// [`crate::write::Fact`] names it). It costs the read no statement of its own.
///
/// The unsealed events are always the chain's newest (later writes seal them oldest first):
/// they follow its last linked place, the newest event that is sealed or of an earlier hash
/// version, found walking `audit_by_place` back from the chain's end, so the read costs
/// what the unsealed tail holds, and no index of its own has to be kept on every write.
pub(crate) fn basis_column(chain: &str, facts: &str) -> String {
    let last_linked = format!(
        "COALESCE((SELECT chain_seq FROM audit_events \
           WHERE chain = {chain} AND (seal IS NOT NULL OR hash_version <> {HASH_VERSION}) \
           ORDER BY chain_seq DESC LIMIT 1), 0)"
    );
    format!(
        "json_object(\
           'facts', json((SELECT json_group_array(json_array(f.fact, COALESCE(v.version, 0))) \
              FROM ({facts}) f LEFT JOIN fact_versions v ON v.fact = f.fact)), \
           'head', COALESCE((SELECT MAX(chain_seq) FROM audit_events WHERE chain = {chain}), 0), \
           'unsealed', json((SELECT json_group_array(json_array(t.chain_seq, t.hash)) \
              FROM (SELECT chain_seq, hash FROM audit_events \
                    WHERE chain = {chain} AND chain_seq > {last_linked} \
                    ORDER BY chain_seq LIMIT {SEALS_PER_WRITE}) t)), \
           'before', (SELECT CASE WHEN p.hash_version = {HASH_VERSION} THEN p.seal ELSE p.hash END \
              FROM audit_events p WHERE p.chain = {chain} AND p.chain_seq = {last_linked} \
                AND EXISTS (SELECT 1 FROM audit_events \
                            WHERE chain = {chain} AND chain_seq > p.chain_seq))\
         ) AS basis"
    )
}

pub(crate) fn read_basis(row: &Row<'_>) -> Result<Basis, StorageError> {
    row.json("basis")
}

impl Store<'_> {
    /// The seals of the unsealed events `basis` saw, `[chainSeq, hash, seal]`: none when the
    /// event before them has no link to seal from (the chain is broken there).
    pub(crate) fn seals_for(&self, basis: &Basis) -> Vec<(i64, String, String)> {
        let Some((first, _)) = basis.unsealed.first() else {
            return Vec::new();
        };
        let mut before = match (&basis.before, first) {
            (Some(before), _) => before.clone(),
            (None, 1) => GENESIS_HASH.to_owned(),
            (None, _) => return Vec::new(),
        };
        let mut seals = Vec::with_capacity(basis.unsealed.len());
        for (expected, (chain_seq, hash)) in (*first..).zip(&basis.unsealed) {
            if *chain_seq != expected {
                break;
            }
            let seal = seal_link(self.audit_key(), &before, *chain_seq, hash);
            seals.push((*chain_seq, hash.clone(), seal.clone()));
            before = seal;
        }
        seals
    }
}
