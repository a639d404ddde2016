//! What the database holds, read straight from its rows (not through the store): the
//! oracles the properties compare the store's answers with.

use std::path::Path;

use super::*;

/// Every row of every table (and the schema), each rendered exactly.
pub(crate) fn dump(db: &rusqlite::Connection) -> Vec<String> {
    let tables: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut dump = Vec::new();
    for table in std::iter::once(&"sqlite_master".to_owned()).chain(&tables) {
        let mut statement = db.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let width = statement.column_count();
        let mut rows: Vec<String> = statement
            .query_map([], |r| {
                (0..width)
                    .map(|i| r.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| format!("{table}: {values:?}"))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        rows.sort();
        dump.extend(rows);
    }
    dump
}

/// Fails with only the rows that differ between two dumps.
pub(crate) fn same_rows(
    before: &[String],
    after: &[String],
    why: &str,
) -> Result<(), TestCaseError> {
    let before_rows: BTreeSet<&String> = before.iter().collect();
    let after_rows: BTreeSet<&String> = after.iter().collect();
    let gone: Vec<&&String> = before_rows.difference(&after_rows).collect();
    let new: Vec<&&String> = after_rows.difference(&before_rows).collect();
    prop_assert!(
        gone.is_empty() && new.is_empty() && before.len() == after.len(),
        "{}: rows gone {:#?}, rows new {:#?}",
        why,
        gone,
        new
    );
    Ok(())
}

/// The bytes of the database file and its write-ahead log.
pub(crate) fn file_bytes(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().unwrap().to_string_lossy()
    ));
    (std::fs::read(path).unwrap(), std::fs::read(wal).ok())
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VmRow {
    pub(crate) tier: String,
    pub(crate) status: String,
    pub(crate) termination_reason: Option<String>,
    pub(crate) terminated_at: Option<i64>,
    /// (unit, running)
    pub(crate) units: Vec<(String, bool)>,
}

pub(crate) fn vm_rows(db: &rusqlite::Connection) -> BTreeMap<String, VmRow> {
    let mut vms: BTreeMap<String, VmRow> = db
        .prepare("SELECT id, tier, status, termination_reason, terminated_at FROM vms")
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                VmRow {
                    tier: r.get(1)?,
                    status: r.get(2)?,
                    termination_reason: r.get(3)?,
                    terminated_at: r.get(4)?,
                    units: Vec::new(),
                },
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let units: Vec<(String, String, bool)> = db
        .prepare("SELECT vm_id, unit_id, running FROM vm_units ORDER BY vm_id, position")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (vm, unit, running) in units {
        vms.get_mut(&vm)
            .expect("a vm_units row has its VM")
            .units
            .push((unit, running));
    }
    vms
}

/// (reservation, unit) → released.
pub(crate) fn released_flags(db: &rusqlite::Connection) -> BTreeMap<(String, String), bool> {
    db.prepare("SELECT reservation_id, unit_id, released FROM reservation_units")
        .unwrap()
        .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

pub(crate) fn count(db: &rusqlite::Connection, sql: &str, params: impl rusqlite::Params) -> i64 {
    db.query_row(sql, params, |r| r.get(0)).unwrap()
}

/// The invariants every state keeps, checked on the rows.
pub(crate) fn check_invariants(
    db: &rusqlite::Connection,
    now: Timestamp,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        count(
            db,
            "SELECT count(*) FROM (SELECT 1 FROM vm_units WHERE running = 1 \
             GROUP BY node_id, unit_id HAVING count(*) > 1)",
            [],
        ),
        0,
        "a unit runs two VMs"
    );
    prop_assert_eq!(
        count(
            db,
            "SELECT count(*) FROM vm_units v \
             JOIN reservation_units ru ON ru.node_id = v.node_id AND ru.unit_id = v.unit_id \
             JOIN reservations r ON r.id = ru.reservation_id \
             WHERE v.running = 1 AND v.tier <> 'spot' AND ru.released = 1 AND r.state = 'live' \
               AND r.starts_at <= ?1 AND (r.ends_at IS NULL OR r.ends_at > ?1)",
            [now.timestamp_millis()],
        ),
        0,
        "a non-spot VM on a released unit"
    );
    prop_assert_eq!(
        count(
            db,
            "SELECT count(*) FROM vms v WHERE (v.status = 'running') <> \
             EXISTS (SELECT 1 FROM vm_units u WHERE u.vm_id = v.id AND u.running = 1)",
            [],
        ),
        0,
        "a VM's status disagrees with its units"
    );
    Ok(())
}

pub(crate) fn audit_events(
    db: &rusqlite::Connection,
) -> Vec<(String, String, String, Option<String>)> {
    db.prepare("SELECT action, terminated, skipped, reason FROM audit_events ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}
