//! The schema, as numbered migrations (`PRAGMA user_version` records how far a database is).
//!
//! No request checks the version: a statement that fails on a table or column the database
//! does not have yet ([`is_behind`]) makes the store apply the missing migrations and run it
//! again (see [`crate::tx::Connection`]). That is sound because every write appends an
//! audit event, and the audit columns of migration 4 are missing on any database older than
//! the triggers of migration 3, so no write can commit without the database's guards; a
//! migration that adds only triggers or indexes must therefore come with a change that the
//! statements it matters to would fail without (`every_write_brings_the_guards` checks it).
//! Several replicas starting at once are safe: the migrations run in one `BEGIN IMMEDIATE`
//! that re-reads the version first, so exactly one of them applies each.
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

use crate::Result;
use crate::rows::Row;
use crate::tx::retry_transient;

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
    // 6: idempotency records live beside the writes they report, committed with them (see
    // idempotency.rs). Each insert sweeps up to two expired records through the expiry
    // index, so storage stays bounded at O(1) cost per request.
    &[
        "CREATE TABLE idempotency_records (
            caller_key_id TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            response TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            PRIMARY KEY (caller_key_id, idempotency_key)
        )",
        "CREATE INDEX idempotency_records_by_expiry ON idempotency_records(expires_at)",
        "CREATE TRIGGER idempotency_records_sweep
            AFTER INSERT ON idempotency_records
            BEGIN
                DELETE FROM idempotency_records WHERE rowid IN (
                    SELECT rowid FROM idempotency_records
                    WHERE expires_at <= NEW.created_at
                    ORDER BY expires_at LIMIT 2);
            END",
    ],
];

/// The schema version this build writes.
pub const LATEST_VERSION: i64 = MIGRATIONS.len() as i64;

pub fn current_version(db: &dyn Sql) -> Result<i64, StorageError> {
    let result = db.execute("PRAGMA user_version", &[])?;
    match result.rows.first() {
        Some(row) => Row(row).int(0),
        None => Ok(0),
    }
}

/// Whether a statement failed because the schema lacks something a newer migration adds.
pub(crate) fn is_behind(error: &StorageError) -> bool {
    let StorageError::Other(message) = error else {
        return false;
    };
    let lower = message.to_ascii_lowercase();
    ["no such table", "no such column", "has no column named"]
        .iter()
        .any(|needle| lower.contains(needle))
}

/// Brings the schema to [`LATEST_VERSION`], in its own write transaction (retried while the
/// database is busy); safe when several instances race, since the version is re-read under
/// the write lock. Whether anything was applied.
pub fn migrate(db: &dyn Sql) -> Result<bool> {
    migrate_to(db, LATEST_VERSION)
}

/// Brings the schema to version `target` (tests start from older versions with it).
pub fn migrate_to(db: &dyn Sql, target: i64) -> Result<bool> {
    if current_version(db)? >= target {
        return Ok(false);
    }
    use_wal(db);
    retry_transient(|| {
        db.execute("BEGIN IMMEDIATE", &[])?;
        let applied = apply_up_to(db, target).and_then(|applied| {
            db.execute("COMMIT", &[])?;
            Ok(applied)
        });
        if applied.is_err() {
            let _ = db.execute("ROLLBACK", &[]);
        }
        Ok(applied?)
    })
}

/// Applies the missing migrations inside a transaction the caller holds the write lock of.
pub(crate) fn apply_pending(db: &dyn Sql) -> Result<bool> {
    Ok(apply_up_to(db, LATEST_VERSION)?)
}

fn apply_up_to(db: &dyn Sql, target: i64) -> Result<bool, StorageError> {
    let version = current_version(db)?;
    for (index, statements) in MIGRATIONS.iter().enumerate() {
        let number = index as i64 + 1;
        if number <= version || number > target {
            continue;
        }
        for statement in *statements {
            db.execute(statement, &[])?;
        }
        db.execute(&format!("PRAGMA user_version = {number}"), &[])?;
    }
    Ok(version < target)
}

/// WAL lets readers proceed while one writer commits. It is a property of a local file, set
/// once; libSQL is always in WAL and refuses the statement that sets it, so it is read first.
pub(crate) fn use_wal(db: &dyn Sql) {
    let mode = db
        .execute("PRAGMA journal_mode", &[])
        .ok()
        .and_then(|result| match result.rows.first()?.first()? {
            SqlValue::Text(mode) => Some(mode.to_ascii_lowercase()),
            _ => None,
        });
    if mode.as_deref().is_some_and(|mode| mode != "wal") {
        let _ = db.execute("PRAGMA journal_mode = WAL", &[]);
    }
}

/// Whether a storage error is one of the schema's own refusals (`RAISE(ABORT, 'refused: …')`)
/// and, if so, which.
pub(crate) fn refusal(error: &StorageError) -> Option<&str> {
    let message = match error {
        StorageError::Constraint(m) | StorageError::Other(m) => m,
        StorageError::Busy(_) | StorageError::Unavailable(_) => return None,
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
