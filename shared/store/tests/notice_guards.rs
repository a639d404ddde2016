//! The database refuses what the notice rules forbid (migration 8), whatever SQL reaches it:
//! a deadline moved later or taken away, a deadline on a non-spot VM; and it knows that a
//! timed release ends (a non-spot VM may be placed on the unit from `released_until` on, and
//! not a millisecond before).

use reservations_store::Sql;
use reservations_store::native::NativeDb;
use reservations_store::schema::migrate;
use reservations_store::storage::Guard;

fn world() -> (tempfile::TempDir, NativeDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    migrate(&db).unwrap();
    db.connection()
        .execute_batch(
            "INSERT INTO orgs VALUES ('o', 'o', 0);
             INSERT INTO nodes VALUES ('n1', 'o', 1, 2, 0, 0);
             INSERT INTO node_units VALUES ('n1', 'u0', 0), ('n1', 'u1', 1);
             INSERT INTO reservations (id, node_id, state, starts_at, ends_at, allowed_org_ids,
                 managing_org_ids, topology_gen, created_at, updated_at)
               VALUES ('r1', 'n1', 'live', 0, NULL, '[\"o\"]', '[]', 1, 0, 0);
             INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released,
                 released_until) VALUES ('r1', 0, 'n1', 'u0', 1, 5000);
             INSERT INTO vms (id, org_id, node_id, tier, status, created_at)
               VALUES ('spot', 'o', 'n1', 'spot', 'running', 0),
                      ('verified', 'o', 'n1', 'verified', 'running', 0);",
        )
        .unwrap();
    (dir, db)
}

/// The guard that refuses `sql`, as the store tells it from SQLite's own message.
fn refused(db: &NativeDb, sql: &str) -> Guard {
    match db.execute(sql, &[]) {
        Ok(_) => panic!("the database accepted {sql}"),
        Err(e) => Guard::of(&e).unwrap_or_else(|| panic!("no guard refused {sql}: {e}")),
    }
}

#[test]
fn a_deadline_only_moves_earlier_and_only_spot_vms_get_one() {
    let (_dir, db) = world();
    let set = |ms: &str| format!("UPDATE vms SET terminates_at = {ms} WHERE id = 'spot'");
    db.connection().execute_batch(&set("10000")).unwrap();
    db.connection().execute_batch(&set("9000")).unwrap();
    db.connection().execute_batch(&set("9000")).unwrap();
    assert_eq!(refused(&db, &set("9001")), Guard::NoticeLengthened);
    assert_eq!(refused(&db, &set("NULL")), Guard::NoticeLengthened);
    assert_eq!(
        refused(
            &db,
            "UPDATE vms SET terminates_at = 1 WHERE id = 'verified'"
        ),
        Guard::NoticeOnNonSpotVm
    );
    let deadline: i64 = db
        .connection()
        .query_row("SELECT terminates_at FROM vms WHERE id = 'spot'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(deadline, 9000);
}

#[test]
fn a_timed_release_keeps_non_spot_vms_off_until_it_ends() {
    let (_dir, db) = world();
    let place = |at: i64| {
        format!(
            "INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at) \
             VALUES ('verified', 0, 'n1', 'u0', 'verified', 1, {at})"
        )
    };
    assert_eq!(refused(&db, &place(4999)), Guard::ReleasedSpotOnly);
    db.connection().execute_batch(&place(5000)).unwrap();
    // Releasing the unit again while the verified VM runs there is refused, though its flag
    // never went back to 0.
    assert_eq!(
        refused(
            &db,
            "UPDATE reservation_units SET released_until = NULL WHERE unit_id = 'u0'"
        ),
        Guard::UnitsNotIdle
    );
}
