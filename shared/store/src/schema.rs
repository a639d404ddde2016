//! The schema, as numbered migrations (`migrations/NNNN_*.sql`) applied idempotently by
//! whichever component opens the database first (`PRAGMA user_version` records how far it is).
//!
//! The invariants of DESIGN.md that do not depend on who is asking are enforced here, in the
//! database, so that no interleaving of requests can break them:
//! - a unit runs at most one running VM (a unique partial index);
//! - a community or verified VM is never placed on a unit released by a reservation whose
//!   term covers the placement, and a unit running one is never released (triggers);
//! - nothing is placed on the units of a `needs-review` reservation (a trigger);
//! - a release or reclaim is recorded and applied by one insert (migration 6), so its audit
//!   event never exists without its change, nor the change without its event.
//!
//! Indexes make every operation O(rows it touches); migration 5 adds the spot market's.

use crate::rows::first_row;
use crate::storage::{Sql, StorageError};
use crate::tx::in_write_transaction;
use crate::{Result, StoreError};

/// The migrations, in order: migration `n` brings the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_model.sql"),
    include_str!("../migrations/0002_operator_keys.sql"),
    include_str!("../migrations/0003_vm_and_release_guards.sql"),
    include_str!("../migrations/0004_audit_need_to_know.sql"),
    include_str!("../migrations/0005_market_indexes.sql"),
    include_str!("../migrations/0006_capacity_changes.sql"),
];

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

pub fn current_version(db: &dyn Sql) -> Result<i64, StorageError> {
    let result = db.execute("PRAGMA user_version", &[])?;
    match first_row(&result) {
        Some(row) => row.int("user_version"),
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
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let target = index as i64 + 1;
            if target <= version {
                continue;
            }
            for statement in statements(migration) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_migration_splits_into_its_statements() {
        let counts: Vec<usize> = MIGRATIONS.iter().map(|m| statements(m).len()).collect();
        assert_eq!(counts, [24, 2, 2, 3, 2, 2]);
        for statement in MIGRATIONS.iter().flat_map(|m| statements(m)) {
            assert!(!statement.ends_with(';'), "{statement}");
            assert!(!statement.trim_start().starts_with("--"), "{statement}");
            if statement.starts_with("CREATE TRIGGER") {
                assert!(statement.ends_with("END"), "{statement}");
            }
        }
    }
}
