//! The migration runner as replicas meet it: no request checks the schema version, a
//! database that is behind is brought up to date by the first statement that needs it (and
//! no write commits without the database's guards), replicas starting together migrate once,
//! and nothing on any path is a statement libSQL refuses.

use std::cell::RefCell;
use std::sync::{Arc, Barrier};

use reservations_domain::access::Caller;
use reservations_domain::time::from_millis;
use reservations_store::idempotency::{KeyedRequest, Lookup, StoredResponse};
use reservations_store::native::NativeDb;
use reservations_store::schema::{LATEST_VERSION, current_version, migrate, migrate_to};
use reservations_store::{Context, Store};
use reservations_store::{Sql, SqlRows, SqlValue, StorageError};

fn ctx<'a>(caller: &'a Caller, request_id: &'a str) -> Context<'a> {
    Context {
        caller,
        now: from_millis(1_800_000_000_000),
        request_id,
        client_request_id: None,
    }
}

fn keyed(key: &str) -> KeyedRequest<'_> {
    KeyedRequest {
        caller_key_id: "operator",
        idempotency_key: key,
        fingerprint: "fp".into(),
        now: from_millis(1_800_000_000_000),
    }
}

fn created() -> StoredResponse {
    StoredResponse {
        status: 201,
        content_type: "application/json".into(),
        body: "{}".into(),
        headers: Vec::new(),
    }
}

/// The triggers of a database, with the table each guards.
fn triggers(db: &NativeDb) -> Vec<(String, String)> {
    let mut statement = db
        .connection()
        .prepare("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
        .unwrap();
    statement
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Whether the database has the table or view a trigger is on (migration 6's trigger is on
/// the view `capacity_changes`).
fn has_table(db: &NativeDb, table: &str) -> bool {
    db.connection()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?",
            [table],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
        == 1
}

/// From every older version: a plain write succeeds and leaves every guard of the tables the
/// database has in place (so no write ever commits without them), and a keyed request finds
/// its table.
#[test]
fn every_write_brings_the_guards() {
    let dir = tempfile::tempdir().unwrap();
    let latest = NativeDb::open(dir.path().join("latest.sqlite")).unwrap();
    migrate(&latest).unwrap();
    let all_guards = triggers(&latest);
    let caller = Caller::operator("operator");
    for version in 0..LATEST_VERSION {
        let db = NativeDb::open(dir.path().join(format!("v{version}.sqlite"))).unwrap();
        migrate_to(&db, version).unwrap();
        assert_eq!(current_version(&db).unwrap(), version);
        let store = Store::keyed(&db, b"").unwrap();
        store
            .identity()
            .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
            .unwrap();
        let guards_of_its_tables: Vec<_> = all_guards
            .iter()
            .filter(|(_, table)| has_table(&db, table))
            .cloned()
            .collect();
        assert_eq!(
            triggers(&db),
            guards_of_its_tables,
            "after a write on version {version}"
        );
        assert_eq!(store.look_up(&keyed("k")).unwrap(), Lookup::Fresh);
        assert!(store.record_refusal(&keyed("k"), &created()).unwrap());
        assert_eq!(current_version(&db).unwrap(), LATEST_VERSION);
        let journal: String = db
            .connection()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal", "a database migrated on the way is in WAL");
    }
}

#[test]
fn replicas_starting_together_migrate_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let replicas = 4;
    let barrier = Arc::new(Barrier::new(replicas));
    let applied: Vec<bool> = (0..replicas)
        .map(|_| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let db = NativeDb::open(&path).unwrap();
                barrier.wait();
                migrate(&db).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|worker| worker.join().unwrap())
        .collect();
    assert_eq!(applied.iter().filter(|a| **a).count(), 1, "{applied:?}");
    let db = NativeDb::open(&path).unwrap();
    assert_eq!(current_version(&db).unwrap(), LATEST_VERSION);
}

/// A connection that answers like libSQL: it refuses every `PRAGMA` that sets a value (but
/// `user_version`), reports WAL, and counts what it is sent.
struct LibsqlLike {
    db: NativeDb,
    sent: RefCell<Vec<String>>,
    refused: RefCell<Vec<String>>,
}

impl Sql for LibsqlLike {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        self.sent.borrow_mut().push(statement.to_owned());
        let upper = statement.trim().to_ascii_uppercase();
        if upper.starts_with("PRAGMA") && upper.contains('=') && !upper.contains("USER_VERSION") {
            self.refused.borrow_mut().push(statement.to_owned());
            return Err(StorageError::from_sqlite_message(format!(
                "unsupported statement: {statement}"
            )));
        }
        if upper == "PRAGMA JOURNAL_MODE" {
            return Ok(SqlRows {
                columns: vec!["journal_mode".into()],
                rows: vec![vec![SqlValue::Text("wal".into())]],
            });
        }
        self.db.execute(statement, params)
    }
}

#[test]
fn no_statement_libsql_refuses_and_no_version_check_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let db = LibsqlLike {
        db: NativeDb::open(dir.path().join("db.sqlite")).unwrap(),
        sent: RefCell::new(Vec::new()),
        refused: RefCell::new(Vec::new()),
    };
    let caller = Caller::operator("operator");
    // The first request on a new database migrates it on the way.
    let store = Store::keyed(&db, b"").unwrap();
    assert!(
        db.sent.borrow().is_empty(),
        "opening the store sends nothing"
    );
    store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    assert_eq!(store.look_up(&keyed("k")).unwrap(), Lookup::Fresh);
    store
        .identity()
        .create_org(&ctx(&caller, "req-2"), "globex", "Globex")
        .unwrap();
    assert!(store.record_refusal(&keyed("k"), &created()).unwrap());
    migrate(&db).unwrap();
    assert_eq!(db.refused.borrow().as_slice(), &[] as &[String]);

    // Later requests: a read is its own statement and nothing else.
    db.sent.borrow_mut().clear();
    let store = Store::keyed(&db, b"").unwrap();
    assert!(store.identity().get_org("acme").unwrap().is_some());
    assert_eq!(db.sent.borrow().len(), 1, "{:?}", db.sent.borrow());
}

/// A database as an earlier build left it, at schema `version`: node `n1` with reservation
/// `r1` and the ended VM `vm-1`.
fn earlier_build_at(version: i64) -> (tempfile::TempDir, NativeDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    reservations_store::native::earlier_build_with_an_unkeyed_reclaim(&db).unwrap();
    migrate_to(&db, version).unwrap();
    (dir, db)
}

#[test]
fn the_versions_of_a_node_s_facts_keep_their_values_under_the_node_s_name() {
    let (_dir, db) = earlier_build_at(19);
    db.connection()
        .execute_batch(
            r#"INSERT INTO fact_versions (fact, version) VALUES
                 ('["node","n1"]', 4), ('["unit","n1","u0"]', 3), ('["reservation","r1"]', 2),
                 ('["vm","vm-1"]', 5), ('["reservation","r-gone"]', 7), ('["vm","vm-gone"]', 8),
                 ('["org","owner"]', 6), ('["org-keys","owner"]', 9), ('["key","k1"]', 1);"#,
        )
        .unwrap();
    migrate_to(&db, 20).unwrap();
    let expected = [
        (r#"["key","k1"]"#, 1),
        (r#"["node","n1","reservation","r1"]"#, 2),
        (r#"["node","n1","unit","u0"]"#, 3),
        (r#"["node","n1","vm","vm-1"]"#, 5),
        (r#"["node","n1"]"#, 4),
        (r#"["org","owner"]"#, 6),
        (r#"["org-keys","owner"]"#, 9),
    ];
    let expected: Vec<(String, i64)> = expected.iter().map(|(f, v)| (f.to_string(), *v)).collect();
    assert_eq!(fact_versions(&db), expected);
}

/// The versions of a database's facts, sorted.
fn fact_versions(db: &NativeDb) -> Vec<(String, i64)> {
    let mut versions: Vec<(String, i64)> = db
        .connection()
        .prepare("SELECT fact, version FROM fact_versions")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    versions.sort();
    versions
}

fn version_of(db: &NativeDb, fact: &str) -> Option<i64> {
    fact_versions(db)
        .into_iter()
        .find(|(f, _)| f == fact)
        .map(|(_, v)| v)
}

#[test]
fn a_vm_that_ended_keeps_no_version_and_a_running_one_keeps_moving() {
    // The ended VM `vm-1` as an earlier build left it, and a running `vm-2`.
    let (_dir, db) = earlier_build_at(20);
    db.connection()
        .execute_batch(
            r#"INSERT INTO vms (id, org_id, node_id, tier, status, created_at)
                 VALUES ('vm-2', 'buyer', 'n1', 'spot', 'running', 2);
               INSERT INTO fact_versions (fact, version)
                 VALUES ('["node","n1","vm","vm-1"]', 5), ('["node","n1","vm","vm-2"]', 1);"#,
        )
        .unwrap();
    let (ended, running) = (
        r#"["node","n1","vm","vm-1"]"#,
        r#"["node","n1","vm","vm-2"]"#,
    );
    assert_eq!(version_of(&db, ended), Some(5));
    assert_eq!(version_of(&db, running), Some(1));

    migrate(&db).unwrap();
    assert_eq!(version_of(&db, ended), None, "the ended VM's version went");
    assert_eq!(version_of(&db, running), Some(1));

    // A notice moves a running VM's version; its end takes the version away, which a plan
    // that read it running (version 2) sees as a move.
    db.connection()
        .execute_batch("UPDATE vms SET terminates_at = 10 WHERE id = 'vm-2'")
        .unwrap();
    assert_eq!(version_of(&db, running), Some(2));
    db.connection()
        .execute_batch("UPDATE vms SET status = 'terminated' WHERE id = 'vm-2'")
        .unwrap();
    assert_eq!(version_of(&db, running), None);
}

#[test]
fn a_write_of_a_newer_build_brings_a_schema_that_changed_only_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db.sqlite")).unwrap();
    migrate(&db).unwrap();
    // The database as the build before left it: its version one less, and its write trigger
    // that version's, which knows every column this build's write names.
    let trigger: String = db
        .connection()
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'write_applies'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let (this, before) = (
        format!("NEW.schema_version > {LATEST_VERSION}"),
        format!("NEW.schema_version > {}", LATEST_VERSION - 1),
    );
    assert!(trigger.contains(&this), "{trigger}");
    db.connection()
        .execute_batch(&format!(
            "DROP TRIGGER write_applies; {}; PRAGMA user_version = {}",
            trigger.replace(&this, &before),
            LATEST_VERSION - 1
        ))
        .unwrap();

    let caller = Caller::operator("operator");
    let store = Store::keyed(&db, b"").unwrap();
    store
        .identity()
        .create_org(&ctx(&caller, "req-1"), "acme", "Acme")
        .unwrap();
    assert_eq!(current_version(&db).unwrap(), LATEST_VERSION);
    assert!(store.identity().get_org("acme").unwrap().is_some());
}
