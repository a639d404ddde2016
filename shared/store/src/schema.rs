//! The schema, as numbered migrations (`PRAGMA user_version` records how far a database is).
//!
//! No request checks the version: a statement that fails on a table or column the database does
//! not have yet ([`StorageError::Behind`]) makes the store apply the missing migrations and run
//! it again (see [`crate::storage::Connection`]). Every write is one insert into the view
//! `writes`, which names the schema version its build writes (`schema_version`): on a schema
//! older than 21 the column is missing, and from 21 on the view's trigger refuses a write of a
//! newer build (`behind: schema`), so any write brings the database up to date before it
//! commits, and no write commits without the guards its build expects
//! (`every_write_brings_the_guards` checks it). Several replicas starting at once are safe: the
//! migrations run in one immediate transaction that re-reads the version first, so exactly one
//! of them applies each.
//!
//! Views and triggers are not in the migrations: `schema/objects.sql` holds the one current
//! definition of each, and whenever migrations run, every view and trigger is dropped and
//! created again from it, in the same transaction. A change to an object therefore comes with
//! a migration (possibly of no statement), and with the version in the write trigger's check
//! raised to the new one.
//!
//! The invariants of docs/design.md that do not depend on who is asking are enforced there, in
//! the database, so that no interleaving of requests can break them:
//! - a unit runs at most one running VM (a unique partial index);
//! - a community or verified VM is never placed on a unit released by a reservation whose
//!   term covers the placement, and a unit running one is never released (triggers);
//! - nothing is placed on the units of a `needs-review` reservation (a trigger);
//! - a mutation, its audit event and its idempotency record are one insert into `writes`,
//!   which refuses it if the audit chain it was planned against has moved.
//!
//! Indexes make every operation O(rows it touches); migration 5 adds the spot market's.

use crate::Result;
use crate::site::{COPY_REACHES_WRITE_WITHIN, poll_until, probe_forwarding};
use crate::storage::{Sql, StorageError};
use crate::storage::{first_row, rows};
use crate::tx::in_transaction;

/// The migrations, in order: migration `n` brings the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_model.sql"),
    include_str!("../migrations/0002_operator_keys.sql"),
    include_str!("../migrations/0003_vm_and_release_guards.sql"),
    include_str!("../migrations/0004_audit_need_to_know.sql"),
    include_str!("../migrations/0005_market_indexes.sql"),
    include_str!("../migrations/0006_capacity_changes.sql"),
    include_str!("../migrations/0007_idempotency_records.sql"),
    include_str!("../migrations/0008_notice_and_timed_release.sql"),
    include_str!("../migrations/0009_chain_per_node.sql"),
    include_str!("../migrations/0010_visibility_and_market_index.sql"),
    include_str!("../migrations/0011_feed_waits.sql"),
    include_str!("../migrations/0012_audit_seal_record.sql"),
    include_str!("../migrations/0013_vms_by_org_and_id.sql"),
    include_str!("../migrations/0014_feed_waits_per_org.sql"),
    include_str!("../migrations/0015_fact_versions_and_seals.sql"),
    include_str!("../migrations/0016_writes_check_the_callers_key.sql"),
    include_str!("../migrations/0017_idempotency_lookup_at_the_primary.sql"),
    include_str!("../migrations/0018_lean_writes.sql"),
    include_str!("../migrations/0019_revocations_in_every_cell.sql"),
    include_str!("../migrations/0020_events_by_place_facts_by_node.sql"),
    include_str!("../migrations/0021_ended_vms_keep_no_version.sql"),
    include_str!("../migrations/0022_idempotency_claims.sql"),
    include_str!("../migrations/0023_no_views_for_replicas.sql"),
];

/// The migration after whose statements the events of earlier builds are sealed again under
/// the audit key, and who sees each event is indexed (see [`crate::audit::seal`]).
const SEALING_VERSION: i64 = 10;

/// The migration after whose statements the sealed trail's record is written (see
/// [`crate::audit::seal::record_seal`]).
const SEAL_RECORD_VERSION: i64 = 12;

/// The current definition of every view and trigger.
pub(crate) const OBJECTS: &str = include_str!("../schema/objects.sql");

/// The statements of a migration file, in order, each without its final `;` (the `Sql`
/// trait runs one statement at a time). A statement ends with a line ending in `;`, except a
/// trigger, whose body holds statements of its own: it ends with the line ending in `END;`.
/// Comment lines between statements are skipped.
pub(crate) fn statements(migration: &str) -> Vec<&str> {
    let mut statements = Vec::new();
    // Where the current statement starts, and whether it is a trigger.
    let mut current: Option<(usize, bool)> = None;
    let mut offset = 0;
    for line in migration.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        let trimmed = line.trim();
        let (start, is_trigger) = match current {
            Some(statement) => statement,
            None if trimmed.is_empty() || trimmed.starts_with("--") => continue,
            None => {
                let words: Vec<String> = trimmed
                    .split_whitespace()
                    .take(2)
                    .map(str::to_ascii_uppercase)
                    .collect();
                *current.insert((line_start, words == ["CREATE", "TRIGGER"]))
            }
        };
        let ends = if is_trigger {
            trimmed.to_ascii_uppercase().ends_with("END;")
        } else {
            trimmed.ends_with(';')
        };
        if ends {
            let end = line_start + line.trim_end().len() - 1;
            statements.push(migration[start..end].trim_end());
            current = None;
        }
    }
    assert!(
        current.is_none(),
        "a migration ends in the middle of a statement"
    );
    statements
}

/// The schema version this build writes.
pub const LATEST_VERSION: i64 = MIGRATIONS.len() as i64;

/// The schema version of the database read. Asked as a table (`pragma_user_version`), which
/// a read replica answers from its own copy; sqld forwards the `PRAGMA` statement itself to
/// the primary, as it does any pragma.
pub fn current_version(db: &dyn Sql) -> Result<i64, StorageError> {
    let result = db.execute("SELECT user_version FROM pragma_user_version", &[])?;
    match first_row(&result) {
        Some(row) => row.int("user_version"),
        None => Ok(0),
    }
}

/// Brings the schema to [`LATEST_VERSION`], in its own write transaction (retried while the
/// database is busy); safe when several instances race, since the version is re-read under
/// the write lock. Whether anything was applied. Events of earlier builds are sealed with
/// `audit_key`, the key the app verifies with.
pub fn migrate_keyed(db: &dyn Sql, audit_key: &[u8]) -> Result<bool> {
    migrate_to_keyed(db, LATEST_VERSION, audit_key)
}

/// [`migrate_keyed`] with the empty key, as [`crate::Store::open`] (tests and tools).
pub fn migrate(db: &dyn Sql) -> Result<bool> {
    migrate_keyed(db, &[])
}

/// Brings the schema to version `target` (tests start from older versions with it).
pub fn migrate_to(db: &dyn Sql, target: i64) -> Result<bool> {
    migrate_to_keyed(db, target, &[])
}

fn migrate_to_keyed(db: &dyn Sql, target: i64, audit_key: &[u8]) -> Result<bool> {
    if current_version(db)? >= target {
        return Ok(false);
    }
    // At an edge site's read replica the version just read may lag, and an explicit
    // transaction may not run wholly on the primary (see `crate::site`): the migrations are
    // the primary's to apply (by an app connected to it), and arrive here by replication.
    // A database the probe cannot tell about is not migrated either: it may be such a copy.
    if probe_forwarding(db) != Some(false) {
        await_version(db, target)?;
        return Ok(false);
    }
    use_wal(db);
    in_transaction(db, |tx| Ok(apply_up_to(tx, target, audit_key)?))
}

/// Waits until the site's copy has the schema at `target`, replicated from the primary. Each
/// look is on a connection of its own, which the copy answers: the connection that forwarded
/// the probe may have its reads answered by the primary (see `crate::site`), which would
/// report a schema the copy does not have yet.
fn await_version(db: &dyn Sql, target: i64) -> Result<(), StorageError> {
    let copy_has_it = || {
        db.next_on_a_new_connection();
        Ok(current_version(db)? >= target)
    };
    match poll_until(COPY_REACHES_WRITE_WITHIN, copy_has_it)? {
        true => Ok(()),
        false => Err(StorageError::Unavailable(
            format!(
                "the primary's schema is older than version {target}: an app connected to the \
                 primary applies the migrations, and this site's copy receives them"
            )
            .into(),
        )),
    }
}

fn apply_up_to(db: &dyn Sql, target: i64, audit_key: &[u8]) -> Result<bool, StorageError> {
    let version = current_version(db)?;
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let number = index as i64 + 1;
        if number <= version || number > target {
            continue;
        }
        for statement in statements(migration) {
            db.execute(statement, &[])?;
        }
        if number == SEALING_VERSION {
            crate::audit::seal::seal_earlier_events(db, audit_key)?;
        }
        if number == SEAL_RECORD_VERSION {
            crate::audit::seal::record_seal(db, audit_key)?;
        }
        db.execute(&format!("PRAGMA user_version = {number}"), &[])?;
    }
    // The objects are the current build's: they need the latest tables.
    if version < target && target == LATEST_VERSION {
        recreate_objects(db)?;
    }
    Ok(version < target)
}

/// Drops every view and trigger and creates them again from [`OBJECTS`].
fn recreate_objects(db: &dyn Sql) -> Result<(), StorageError> {
    let existing = db.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('view', 'trigger') \
         AND name NOT LIKE 'sqlite_%' ORDER BY type DESC",
        &[],
    )?;
    for row in rows(&existing) {
        let kind = row.text("type")?.to_ascii_uppercase();
        db.execute(
            &format!("DROP {kind} IF EXISTS \"{}\"", row.text("name")?),
            &[],
        )?;
    }
    for statement in statements(OBJECTS) {
        db.execute(statement, &[])?;
    }
    Ok(())
}

/// WAL lets readers proceed while one writer commits. It is a property of a local file, set
/// once; libSQL is always in WAL and refuses the statement that sets it, so it is read first.
pub(crate) fn use_wal(db: &dyn Sql) {
    let mode = db
        .execute("PRAGMA journal_mode", &[])
        .ok()
        .and_then(|result| first_row(&result)?.text("journal_mode").ok())
        .map(|mode| mode.to_ascii_lowercase());
    if mode.as_deref().is_some_and(|mode| mode != "wal") {
        let _ = db.execute("PRAGMA journal_mode = WAL", &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_trigger_refuses_writes_of_builds_newer_than_this_schema() {
        let check = format!("WHERE NEW.schema_version > {LATEST_VERSION};");
        assert_eq!(
            OBJECTS.matches(&check).count(),
            1,
            "schema/objects.sql checks a write's schema_version against this schema's version"
        );
    }

    #[test]
    fn each_migration_splits_into_its_statements() {
        let counts: Vec<usize> = MIGRATIONS.iter().map(|m| statements(m).len()).collect();
        assert_eq!(
            counts,
            [
                21, 2, 0, 3, 2, 0, 2, 8, 4, 7, 3, 1, 2, 2, 4, 0, 0, 9, 1, 14, 1, 2, 0
            ]
        );
        assert_eq!(statements(OBJECTS).len(), 36);
        for statement in MIGRATIONS
            .iter()
            .chain([&OBJECTS])
            .flat_map(|m| statements(m))
        {
            assert!(!statement.ends_with(';'), "{statement}");
            assert!(!statement.trim_start().starts_with("--"), "{statement}");
            if statement.starts_with("CREATE TRIGGER") {
                assert!(statement.ends_with("END"), "{statement}");
            }
        }
    }
}
