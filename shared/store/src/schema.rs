//! The schema, as numbered migrations applied idempotently by whichever component opens the
//! database first (`PRAGMA user_version` records how far it is).
//!
//! The invariants of DESIGN.md that do not depend on who is asking are enforced here, in the
//! database, so that no interleaving of requests can break them:
//! - a unit runs at most one running VM (a unique partial index);
//! - a community or verified VM is never placed on a unit released by a reservation whose
//!   term covers the placement, and a unit running one is never released (triggers);
//! - nothing is placed on the units of a `needs-review` reservation (a trigger).
//!
//! Indexes make every operation O(rows it touches); migration 4 adds the spot market's.

use reservations_domain::storage::{Sql, SqlValue, StorageError};

use crate::rows::Row;
use crate::tx::in_write_transaction;
use crate::{Result, StoreError};

/// How long a connection waits for another writer before SQLite reports it busy.
pub const BUSY_TIMEOUT_MS: u32 = 5_000;

const MIGRATIONS: &[&[&str]] = &[
    // 1: the whole model.
    &[
        "CREATE TABLE orgs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            created_at INTEGER NOT NULL
        )",
        "CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            org_id TEXT NOT NULL REFERENCES orgs(id),
            name TEXT NOT NULL,
            role TEXT NOT NULL,
            permissions TEXT,
            secret_hash TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            created_by TEXT NOT NULL,
            revoked_at INTEGER
        )",
        "CREATE INDEX api_keys_by_org ON api_keys(org_id, created_at, id)",
        "CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            owner_org_id TEXT NOT NULL REFERENCES orgs(id),
            topology_gen INTEGER NOT NULL,
            unit_count INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        )",
        "CREATE INDEX nodes_by_owner ON nodes(owner_org_id)",
        "CREATE TABLE node_units (
            node_id TEXT NOT NULL REFERENCES nodes(id),
            unit_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (node_id, unit_id)
        ) WITHOUT ROWID",
        "CREATE TABLE reservations (
            id TEXT PRIMARY KEY,
            node_id TEXT NOT NULL REFERENCES nodes(id),
            state TEXT NOT NULL CHECK (state IN ('live', 'cancelled', 'needs-review')),
            starts_at INTEGER NOT NULL,
            ends_at INTEGER,
            allowed_org_ids TEXT NOT NULL,
            managing_org_ids TEXT NOT NULL,
            contract_ref TEXT,
            reason TEXT,
            topology_gen INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            CHECK (ends_at IS NULL OR ends_at > starts_at)
        )",
        "CREATE INDEX reservations_by_node ON reservations(node_id, created_at, id)",
        "CREATE TABLE reservation_units (
            reservation_id TEXT NOT NULL REFERENCES reservations(id),
            position INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            unit_id TEXT NOT NULL,
            released INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
            PRIMARY KEY (reservation_id, unit_id)
        ) WITHOUT ROWID",
        "CREATE INDEX reservation_units_by_position ON reservation_units(reservation_id, position)",
        "CREATE INDEX reservation_units_by_unit ON reservation_units(node_id, unit_id)",
        "CREATE TABLE vms (
            id TEXT PRIMARY KEY,
            org_id TEXT NOT NULL REFERENCES orgs(id),
            node_id TEXT NOT NULL REFERENCES nodes(id),
            tier TEXT NOT NULL CHECK (tier IN ('spot', 'community', 'verified')),
            status TEXT NOT NULL CHECK (status IN ('running', 'terminated')),
            termination_reason TEXT,
            created_at INTEGER NOT NULL,
            terminated_at INTEGER
        )",
        "CREATE INDEX vms_by_org ON vms(org_id, created_at, id)",
        "CREATE INDEX vms_by_node ON vms(node_id, created_at, id)",
        "CREATE TABLE vm_units (
            vm_id TEXT NOT NULL REFERENCES vms(id),
            position INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            unit_id TEXT NOT NULL,
            tier TEXT NOT NULL,
            running INTEGER NOT NULL CHECK (running IN (0, 1)),
            placed_at INTEGER NOT NULL,
            PRIMARY KEY (vm_id, unit_id)
        ) WITHOUT ROWID",
        "CREATE UNIQUE INDEX one_running_vm_per_unit ON vm_units(node_id, unit_id) WHERE running = 1",
        "CREATE TRIGGER no_non_spot_vm_on_released_unit
            BEFORE INSERT ON vm_units
            WHEN NEW.running = 1 AND NEW.tier <> 'spot' AND EXISTS (
                SELECT 1 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id
                WHERE ru.node_id = NEW.node_id AND ru.unit_id = NEW.unit_id AND ru.released = 1
                  AND r.state = 'live' AND r.starts_at <= NEW.placed_at
                  AND (r.ends_at IS NULL OR r.ends_at > NEW.placed_at))
            BEGIN SELECT RAISE(ABORT, 'refused: released-spot-only'); END",
        "CREATE TRIGGER no_vm_on_needs_review_units
            BEFORE INSERT ON vm_units
            WHEN NEW.running = 1 AND EXISTS (
                SELECT 1 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id
                WHERE ru.node_id = NEW.node_id AND ru.unit_id = NEW.unit_id
                  AND r.state = 'needs-review')
            BEGIN SELECT RAISE(ABORT, 'refused: withheld-needs-review'); END",
        "CREATE TRIGGER no_release_of_unit_running_non_spot_vm
            BEFORE UPDATE OF released ON reservation_units
            WHEN NEW.released = 1 AND OLD.released = 0 AND EXISTS (
                SELECT 1 FROM vm_units v
                WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
                  AND v.running = 1 AND v.tier <> 'spot')
            BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END",
        "CREATE TABLE audit_events (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            at INTEGER NOT NULL,
            actor_key_id TEXT NOT NULL,
            actor_org_id TEXT,
            action TEXT NOT NULL,
            node_id TEXT,
            reservation_id TEXT,
            vm_id TEXT,
            org_id TEXT,
            subject_id TEXT,
            unit_ids TEXT NOT NULL,
            terminated TEXT NOT NULL,
            skipped TEXT NOT NULL,
            reason TEXT,
            request_id TEXT NOT NULL,
            visible_to TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        )",
        "CREATE INDEX audit_by_node ON audit_events(node_id, seq)",
        "CREATE INDEX audit_by_reservation ON audit_events(reservation_id, seq)",
        "CREATE INDEX audit_by_action ON audit_events(action, seq)",
        "CREATE INDEX audit_by_time ON audit_events(at, seq)",
    ],
    // 2: keys of platform operators, above all orgs (the first operator credential is the
    // `operator_token` variable, which is configuration, not a row).
    &[
        "CREATE TABLE operator_keys (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            secret_hash TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            created_by TEXT NOT NULL,
            revoked_at INTEGER
        )",
        "CREATE INDEX operator_keys_by_creation ON operator_keys(created_at, id)",
    ],
    // 3: close the write paths the first guards did not cover: a VM row brought back to
    // running (or re-tiered), and a unit inserted already released.
    &[
        "CREATE TRIGGER no_vm_row_revived_or_retiered
            BEFORE UPDATE OF running, tier ON vm_units
            WHEN NEW.tier <> OLD.tier OR (NEW.running = 1 AND OLD.running = 0)
            BEGIN SELECT RAISE(ABORT, 'refused: vm-rows-are-final'); END",
        "CREATE TRIGGER no_released_insert_on_unit_running_non_spot_vm
            BEFORE INSERT ON reservation_units
            WHEN NEW.released = 1 AND EXISTS (
                SELECT 1 FROM vm_units v
                WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
                  AND v.running = 1 AND v.tier <> 'spot')
            BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END",
    ],
    // 4: audit events by need to know (orgs whose VMs an event terminated see only their own
    // part), the client's request id beside the server's, and hashes keyed with `audit_key`
    // from version 2 on (earlier events keep their version-1 hashes).
    &[
        "ALTER TABLE audit_events ADD COLUMN client_request_id TEXT",
        "ALTER TABLE audit_events ADD COLUMN vm_owners TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE audit_events ADD COLUMN hash_version INTEGER NOT NULL DEFAULT 1",
    ],
    // 5: the spot market lists released units by node and unit from a cursor; a partial
    // index holds only released units, so a page walks only those (O(units listed)), and
    // another finds a node's needs-review reservations (rare) without scanning the others.
    &[
        "CREATE INDEX reservation_units_released ON reservation_units(node_id, unit_id) WHERE released = 1",
        "CREATE INDEX reservations_needs_review ON reservations(node_id) WHERE state = 'needs-review'",
    ],
];

/// The schema version this build writes.
pub const LATEST_VERSION: i64 = MIGRATIONS.len() as i64;

/// Per-connection settings: wait for other writers instead of failing at once.
pub fn prepare_connection(db: &dyn Sql) -> Result<(), StorageError> {
    db.execute(&format!("PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}"), &[])?;
    Ok(())
}

pub fn current_version(db: &dyn Sql) -> Result<i64, StorageError> {
    let result = db.execute("PRAGMA user_version", &[])?;
    match result.rows.first() {
        Some(row) => Row(row).int(0),
        None => Ok(0),
    }
}

/// Brings the schema to [`LATEST_VERSION`]. Cheap when it already is (one pragma read);
/// safe when several instances race (the version is re-read under the write lock).
pub fn migrate(db: &dyn Sql) -> Result<()> {
    let version = current_version(db)?;
    if version >= LATEST_VERSION {
        return Ok(());
    }
    if version == 0 {
        // WAL lets readers proceed while one writer commits; it is a property of the file,
        // so setting it once is enough, and it cannot be set inside a transaction.
        let _ = db.execute("PRAGMA journal_mode = WAL", &[]);
    }
    in_write_transaction(db, || {
        let version = current_version(db)?;
        for (index, statements) in MIGRATIONS.iter().enumerate() {
            let target = index as i64 + 1;
            if target <= version {
                continue;
            }
            for statement in *statements {
                db.execute(statement, &[])?;
            }
            db.execute(&format!("PRAGMA user_version = {target}"), &[])?;
        }
        Ok::<_, StoreError>(())
    })
}

/// Whether a storage error is one of the schema's own refusals (`RAISE(ABORT, 'refused: …')`)
/// and, if so, which.
pub(crate) fn refusal(error: &StorageError) -> Option<&str> {
    let message = match error {
        StorageError::Constraint(m) | StorageError::Other(m) => m,
        StorageError::Busy(_) => return None,
    };
    let start = message.find("refused: ")? + "refused: ".len();
    let rest = &message[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether a storage error is the one-running-VM-per-unit index refusing a second VM.
pub(crate) fn is_unit_busy_violation(error: &StorageError) -> bool {
    matches!(error, StorageError::Constraint(m) | StorageError::Other(m)
        if m.contains("UNIQUE") && m.contains("vm_units"))
}

/// Parameters are borrowed from many places; this keeps call sites short.
pub(crate) fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_owned())
}
