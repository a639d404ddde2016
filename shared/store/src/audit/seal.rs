//! The events earlier builds wrote, brought once into the one chain format.
//!
//! Before each node had a chain of its own, every event joined one chain, `trail`, hashed
//! with the version of its day: 1 (SHA-256, unkeyed), then 2 and 3 (keyed with `audit_key`;
//! 3 adds deadlines and a release's end). Version 1 events were also written before
//! need to know, so their audience is the old one, which let a spot buyer read the
//! reservation, reason and parties of a reclaim that took its VM.
//!
//! When the schema is brought to version 10, and only then, [`seal_earlier_events`] walks
//! `trail` from its first event, checks each event as its version was written (its hash, its
//! link, no unkeyed event after keyed ones), derives the audience of the version-1 events
//! again from what they record, and seals each one again as version 4, keyed, linked to the
//! one sealed before it. From then on every chain holds version 4 only, and rewriting any
//! event needs the key. An event that does not check out is left as it was, with everything
//! after it: verification then names the chain broken there, so sealing never launders an
//! edit made before it. The sealing is then recorded, MACed with the key ([`record_seal`]),
//! and verification holds `trail` to that record and reports when it was sealed.

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use reservations_domain::audit::{AffectedVm, EventAudience};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    AuditEvent, CHAINED_HASH_VERSION as HASH_VERSION, GENESIS_HASH, TRAIL_CHAIN, deadlines_json,
};
use crate::storage::{Sql, SqlValue, StorageError};
use crate::storage::{exec, first_row, json_list, rows, text};

/// Events read and sealed per statement.
const BATCH: i64 = 1000;

/// Seals the events of `trail` written with an earlier hash version, then rebuilds who may
/// see each event (`audit_visibility`) from every event's audience.
pub(crate) fn seal_earlier_events(db: &dyn Sql, audit_key: &[u8]) -> Result<(), StorageError> {
    let mut walk = TrailWalk {
        expected_seq: 1,
        written_prev: GENESIS_HASH.to_owned(),
        sealed_prev: GENESIS_HASH.to_owned(),
        keyed_seen: false,
    };
    'batches: loop {
        let result = exec(
            db,
            &format!(
                "SELECT {} FROM audit_events e WHERE e.chain = ? AND e.chain_seq >= ? \
                 ORDER BY e.chain_seq LIMIT {BATCH}",
                crate::audit::COLUMNS_BEFORE_SEALS
            ),
            &[text(TRAIL_CHAIN), SqlValue::Integer(walk.expected_seq)],
        )?;
        if result.rows.is_empty() {
            break;
        }
        let mut batch = Vec::new();
        let mut done = false;
        for row in rows(&result) {
            let Ok(event) = crate::audit::read_event(row) else {
                done = true;
                break;
            };
            if !walk.checks_out(&event, audit_key) {
                done = true;
                break;
            }
            walk.written_prev = event.hash.clone();
            walk.keyed_seen |= event.hash_version > 1;
            walk.expected_seq += 1;
            batch.push(event);
        }
        let audiences = derived_audiences(db, &batch)?;
        let mut sealed = Vec::with_capacity(batch.len());
        for mut event in batch {
            if let Some(audience) = audiences.get(&event.seq) {
                event.visible_to = audience.principals.clone();
                event.vm_owners = audience.vm_owners.clone();
            }
            event.hash_version = HASH_VERSION;
            event.prev_hash = walk.sealed_prev.clone();
            event.hash = event
                .compute_hash(audit_key)
                .expect("the current hash version is known");
            walk.sealed_prev = event.hash.clone();
            sealed.push(serde_json::json!({
                "seq": event.seq,
                // As text, so the stored lists read as a write stores them (fields in order).
                "visibleTo": serde_json::to_string(&event.visible_to).expect("a list serializes"),
                "vmOwners": serde_json::to_string(&event.vm_owners).expect("a list serializes"),
                "prevHash": event.prev_hash,
                "hash": event.hash,
            }));
        }
        if !sealed.is_empty() {
            exec(
                db,
                "UPDATE audit_events SET visible_to = s.value ->> 'visibleTo', \
                   vm_owners = s.value ->> 'vmOwners', hash_version = ?2, \
                   prev_hash = s.value ->> 'prevHash', hash = s.value ->> 'hash' \
                 FROM json_each(?1) s WHERE audit_events.seq = s.value ->> 'seq'",
                &[
                    SqlValue::Text(serde_json::Value::Array(sealed).to_string()),
                    SqlValue::Integer(HASH_VERSION),
                ],
            )?;
        }
        if done {
            break 'batches;
        }
    }
    rebuild_visibility(db)
}

/// Where the walk of `trail` is: the place and link the next event must have as written,
/// and the hash the next sealed event links to.
struct TrailWalk {
    expected_seq: i64,
    written_prev: String,
    sealed_prev: String,
    keyed_seen: bool,
}

impl TrailWalk {
    fn checks_out(&self, event: &AuditEvent, audit_key: &[u8]) -> bool {
        event.chain_seq == self.expected_seq
            && event.prev_hash == self.written_prev
            && (1..HASH_VERSION).contains(&event.hash_version)
            && !(event.hash_version == 1 && self.keyed_seen)
            && written_hash(event, audit_key).as_ref() == Some(&event.hash)
    }
}

/// The hash an event of version 1, 2 or 3 was written with: `prevHash + "\n" + content`,
/// hashed (1) or MACed with `audit_key` (2, 3), its content a JSON array in a fixed order.
fn written_hash(event: &AuditEvent, audit_key: &[u8]) -> Option<String> {
    let mut content = serde_json::json!([
        event.seq,
        event.id,
        event.at.timestamp_millis(),
        event.actor_key_id,
        event.actor_org_id,
        event.action,
        event.node_id,
        event.reservation_id,
        event.vm_id,
        event.org_id,
        event.subject_id,
        event.unit_ids,
        event.terminated,
        event.skipped,
        event.reason,
        event.request_id,
    ]);
    let fields = content.as_array_mut().expect("an array");
    match event.hash_version {
        1 => fields.push(serde_json::json!(event.visible_to)),
        2 | 3 => fields.extend([
            serde_json::json!(event.client_request_id),
            serde_json::json!(event.visible_to),
            serde_json::json!(event.vm_owners),
        ]),
        _ => return None,
    }
    if event.hash_version == 3 {
        let deadlines: serde_json::Value =
            serde_json::from_str(&deadlines_json(&event.deadlines)).expect("a JSON object");
        fields.extend([
            deadlines,
            serde_json::json!(event.release_until.map(|t| t.timestamp_millis())),
        ]);
    }
    let input = format!("{}\n{content}", event.prev_hash);
    Some(match event.hash_version {
        1 => hex::encode(Sha256::digest(input)),
        _ => {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(audit_key).expect("HMAC takes a key of any length");
            mac.update(input.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        }
    })
}

/// The parties of a reservation, as an event about it names them now.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReservationParties {
    id: String,
    owner: String,
    managing_org_ids: Vec<String>,
    allowed_org_ids: Vec<String>,
}

/// A VM an event terminated, with its org and units.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VmOwner {
    id: String,
    org_id: String,
    unit_ids: Vec<String>,
}

/// The audience, under need to know, of the version-1 events of `batch` about reservations
/// and VMs (the events whose old audience named more than their principals), derived from
/// what they record: a reservation's parties are its node's owner, its managing orgs and its
/// audience; a VM's principal is its org; the orgs of the VMs an event terminated see their
/// own part. Where the event's reservation or VM is gone, only the acting org (and
/// operators) see it. Other events keep the audience they were written with.
fn derived_audiences(
    db: &dyn Sql,
    batch: &[AuditEvent],
) -> Result<BTreeMap<i64, EventAudience>, StorageError> {
    let derived: Vec<&AuditEvent> = batch
        .iter()
        .filter(|e| e.hash_version == 1)
        .filter(|e| e.action.starts_with("reservation.") || e.action.starts_with("vm."))
        .collect();
    if derived.is_empty() {
        return Ok(BTreeMap::new());
    }
    let reservation_ids: BTreeSet<&String> = derived
        .iter()
        .filter_map(|e| e.reservation_id.as_ref())
        .collect();
    let vm_ids: BTreeSet<&String> = derived
        .iter()
        .flat_map(|e| e.vm_id.iter().chain(&e.terminated))
        .collect();
    let result = exec(
        db,
        "SELECT (SELECT json_group_array(json_object('id', r.id, 'owner', n.owner_org_id, \
                 'managingOrgIds', json(r.managing_org_ids), \
                 'allowedOrgIds', json(r.allowed_org_ids))) \
               FROM reservations r JOIN nodes n ON n.id = r.node_id \
               WHERE r.id IN (SELECT value FROM json_each(?1))) AS reservations, \
           (SELECT json_group_array(json_object('id', v.id, 'orgId', v.org_id, \
                 'unitIds', json((SELECT json_group_array(unit_id) FROM vm_units u \
                             WHERE u.vm_id = v.id)))) \
               FROM vms v WHERE v.id IN (SELECT value FROM json_each(?2))) AS vms",
        &[
            json_list(&reservation_ids.into_iter().cloned().collect::<Vec<_>>()),
            json_list(&vm_ids.into_iter().cloned().collect::<Vec<_>>()),
        ],
    )?;
    let row = rows(&result)
        .next()
        .ok_or_else(|| StorageError::Other("no facts row".into()))?;
    let reservations: BTreeMap<String, ReservationParties> = row
        .json::<Vec<ReservationParties>>("reservations")?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    let vms: BTreeMap<String, VmOwner> = row
        .json::<Vec<VmOwner>>("vms")?
        .into_iter()
        .map(|v| (v.id.clone(), v))
        .collect();
    let mut audiences = BTreeMap::new();
    for event in derived {
        let mut principals: Vec<String> = Vec::new();
        if let Some(parties) = event
            .reservation_id
            .as_ref()
            .and_then(|r| reservations.get(r))
        {
            principals.push(parties.owner.clone());
            principals.extend(parties.managing_org_ids.iter().cloned());
            principals.extend(parties.allowed_org_ids.iter().cloned());
        }
        if event.action == "vm.place"
            && let Some(vm) = event.vm_id.as_ref().and_then(|v| vms.get(v))
        {
            principals.push(vm.org_id.clone());
        }
        let affected: Vec<AffectedVm> = event
            .terminated
            .iter()
            .filter_map(|id| vms.get(id))
            .map(|vm| AffectedVm {
                vm_id: vm.id.clone(),
                org_id: vm.org_id.clone(),
                unit_ids: vm.unit_ids.clone(),
            })
            .collect();
        let audience = EventAudience::new(event.actor_org_id.as_deref(), principals, &affected);
        audiences.insert(event.seq, audience);
    }
    Ok(audiences)
}

/// Rebuilds `audit_visibility` from every event's principals and VM owners. A row whose
/// audience cannot be read is seen by operators only.
fn rebuild_visibility(db: &dyn Sql) -> Result<(), StorageError> {
    exec(db, "DELETE FROM audit_visibility", &[])?;
    exec(
        db,
        "INSERT OR IGNORE INTO audit_visibility (org_id, seq, full_view) \
         SELECT p.value, e.seq, 1 FROM audit_events e, \
           json_each(CASE WHEN json_valid(e.visible_to) AND json_type(e.visible_to) = 'array' \
                     THEN e.visible_to ELSE '[]' END) p \
         WHERE p.type = 'text'",
        &[],
    )?;
    exec(
        db,
        "INSERT OR IGNORE INTO audit_visibility (org_id, seq, full_view) \
         SELECT o.value ->> 'orgId', e.seq, 0 FROM audit_events e, \
           json_each(CASE WHEN json_valid(e.vm_owners) AND json_type(e.vm_owners) = 'array' \
                     THEN e.vm_owners ELSE '[]' END) o \
         WHERE o.type = 'object' AND json_type(o.value, '$.orgId') = 'text'",
        &[],
    )?;
    Ok(())
}

/// How far the sealing of `trail` reached and when: verification holds the trail to it.
/// MACed with the audit key, so it cannot be moved without the key (see
/// `migrations/0012_audit_seal_record.sql`).
pub(crate) struct SealRecord {
    /// The last sealed event (sealing goes from the first event on, without gaps).
    pub through_seq: i64,
    pub through_hash: String,
    /// Milliseconds since the epoch, the database's clock.
    pub sealed_at: i64,
    mac: String,
}

impl SealRecord {
    fn expected_mac(&self, audit_key: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(audit_key).expect("HMAC takes a key of any length");
        mac.update(
            format!(
                "seal\n{TRAIL_CHAIN}\n{}\n{}\n{}",
                self.through_seq, self.through_hash, self.sealed_at
            )
            .as_bytes(),
        );
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether the record is the one the key wrote.
    pub fn checks_out(&self, audit_key: &[u8]) -> bool {
        self.mac == self.expected_mac(audit_key)
    }
}

/// Records how far `trail` is sealed (its events of the current version, from the first on)
/// and when. A database with no such event gets no record.
pub(crate) fn record_seal(db: &dyn Sql, audit_key: &[u8]) -> Result<(), StorageError> {
    let result = exec(
        db,
        "SELECT e.chain_seq AS chain_seq, e.hash AS hash, \
           CAST(strftime('%s', 'now') AS INTEGER) * 1000 AS now \
         FROM audit_events e WHERE e.chain = ? AND e.hash_version = ? \
         ORDER BY e.chain_seq DESC LIMIT 1",
        &[text(TRAIL_CHAIN), SqlValue::Integer(HASH_VERSION)],
    )?;
    let Some(row) = first_row(&result) else {
        return Ok(());
    };
    let mut record = SealRecord {
        through_seq: row.int("chain_seq")?,
        through_hash: row.text("hash")?,
        sealed_at: row.int("now")?,
        mac: String::new(),
    };
    record.mac = record.expected_mac(audit_key);
    exec(
        db,
        "INSERT INTO audit_seals (chain, through_seq, through_hash, sealed_at, mac) \
         VALUES (?, ?, ?, ?, ?)",
        &[
            text(TRAIL_CHAIN),
            SqlValue::Integer(record.through_seq),
            text(&record.through_hash),
            SqlValue::Integer(record.sealed_at),
            text(&record.mac),
        ],
    )?;
    Ok(())
}

/// The seal record of `trail`, if it was sealed.
pub(crate) fn read_seal(db: &dyn Sql) -> Result<Option<SealRecord>, StorageError> {
    let result = exec(
        db,
        "SELECT through_seq, through_hash, sealed_at, mac FROM audit_seals WHERE chain = ?",
        &[text(TRAIL_CHAIN)],
    )?;
    first_row(&result)
        .map(|row| {
            Ok(SealRecord {
                through_seq: row.int("through_seq")?,
                through_hash: row.text("through_hash")?,
                sealed_at: row.int("sealed_at")?,
                mac: row.text("mac")?,
            })
        })
        .transpose()
}
