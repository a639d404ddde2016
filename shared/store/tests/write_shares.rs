//! Each org's share of the writes (docs/design.md, "One org's share of the writes"): a write
//! statement runs only with a turn in its org's share, taken just before the statement and
//! given back just after; a write whose org has its whole share running waits for a turn,
//! off the database, while other orgs' writes go on; counters that fail let writes go
//! without a turn. What is asserted is the order of what happened, never how long it took.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod acting;

use acting::{ctx, open_ended_reservation, org_key};
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::share::{WINDOW_SECS, share_key, window_now};
use reservations_store::storage::SHARE_WAIT;
use reservations_store::{Counters, Sql, SqlRows, SqlValue, StorageError, Store, StoreError};

const SHARE: i64 = 2;

/// What happened, in order: counter moves and write statements.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Log {
    fn note(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }

    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn position(&self, entry: &str) -> Option<usize> {
        self.entries().iter().position(|e| e == entry)
    }
}

/// Counters in memory, as a shared key-value store would keep them; `failing`: every call
/// fails; `full_for`: this org's counters read and count as full whatever is added.
struct MemoryCounters {
    values: Mutex<HashMap<String, i64>>,
    log: Arc<Log>,
    failing: bool,
    full_for: Option<&'static str>,
}

impl MemoryCounters {
    fn new(log: &Arc<Log>) -> MemoryCounters {
        MemoryCounters {
            values: Mutex::default(),
            log: log.clone(),
            failing: false,
            full_for: None,
        }
    }

    fn value(&self, key: &str) -> i64 {
        self.values.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn set(&self, key: &str, value: i64) {
        self.values.lock().unwrap().insert(key.to_owned(), value);
    }

    fn check(&self) -> Result<(), StorageError> {
        match self.failing {
            true => Err(StorageError::Unavailable("the counters are down".into())),
            false => Ok(()),
        }
    }

    fn is_full(&self, key: &str) -> bool {
        self.full_for
            .is_some_and(|org| key.starts_with(&format!("write-share/{org}/")))
    }
}

impl Counters for MemoryCounters {
    fn add(&self, key: &str, delta: i64) -> Result<i64, StorageError> {
        self.check()?;
        let mut values = self.values.lock().unwrap();
        let value = values.entry(key.to_owned()).or_default();
        *value += delta;
        let seen = if self.is_full(key) { SHARE + 1 } else { *value };
        self.log.note(format!("add {delta:+} {key} = {seen}"));
        Ok(seen)
    }

    fn read(&self, key: &str) -> Result<i64, StorageError> {
        self.check()?;
        Ok(if self.is_full(key) {
            SHARE
        } else {
            self.value(key)
        })
    }

    fn remove(&self, key: &str) -> Result<(), StorageError> {
        self.check()?;
        self.values.lock().unwrap().remove(key);
        self.log.note(format!("remove {key}"));
        Ok(())
    }
}

/// A database that notes each write statement in the log.
struct Logged {
    db: NativeDb,
    log: Arc<Log>,
}

impl Sql for Logged {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let result = self.db.execute(statement, params);
        if statement.starts_with("INSERT INTO writes") {
            self.log.note("write statement".into());
        }
        result
    }
}

/// Two orgs, `a` and `b`, each with a node of 4 units reserved for itself.
fn market(path: &std::path::Path) {
    let db = NativeDb::open(path).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    let ctx = ctx(&operator);
    for org in ["a", "b"] {
        store.identity().create_org(&ctx, org, org).unwrap();
        let units: Vec<String> = (0..4).map(|i| format!("{org}-gpu-{i}")).collect();
        store
            .capacity()
            .put_node(&ctx, &format!("{org}-node"), org, &units)
            .unwrap();
        store
            .capacity()
            .create_reservation(
                &ctx,
                &format!("{org}-node"),
                &format!("{org}-reservation"),
                &open_ended_reservation(units, vec![org.into()]),
            )
            .unwrap();
    }
}

/// `org` releases its unit `unit`, with its share counted in `counters`.
fn release(
    path: &std::path::Path,
    log: &Arc<Log>,
    counters: &dyn Counters,
    org: &str,
    unit: usize,
) -> Result<(), StoreError> {
    let db = Logged {
        db: NativeDb::open(path).unwrap(),
        log: log.clone(),
    };
    let store = Store::open(&db).unwrap().with_write_shares(counters, SHARE);
    let caller = org_key(org, Role::CapacityManager);
    let units = [format!("{org}-gpu-{unit}")];
    store
        .capacity()
        .change_capacity(
            &ctx(&caller),
            CapacityChange {
                action: CapacityAction::Release,
                node_id: &format!("{org}-node"),
                reservation_id: &format!("{org}-reservation"),
                unit_ids: &units,
                reason: None,
                representation: Representation::Minimal,
                notice_seconds: None,
                until: None,
            },
        )
        .map(drop)
}

/// Waits, if need be, until the wall clock is well inside a window, so that a test's writes
/// count in one window.
fn inside_a_window() -> u64 {
    let mut window = None;
    until("the clock is well inside a window", || {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let into_window = now.as_secs_f64() % WINDOW_SECS as f64;
        window = (into_window < WINDOW_SECS as f64 - 2.0).then(window_now);
        window.is_some()
    });
    window.expect("inside a window")
}

/// Waits until `condition` holds, looking every millisecond, and fails the test naming
/// `what` if it has not within 30 s: a test that waits on something that never comes fails
/// rather than hangs.
#[track_caller]
fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let patience = Duration::from_secs(30);
    let deadline = Instant::now() + patience;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{what}: not so after {patience:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_write_takes_a_turn_for_its_statement_and_gives_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    market(&path);
    let log = Arc::new(Log::default());
    let counters = MemoryCounters::new(&log);
    let window = inside_a_window();
    let key = share_key("a", window);
    let stale = share_key("a", window - 2);
    counters.set(&stale, 5); // a share a killed request never gave back, two windows ago

    release(&path, &log, &counters, "a", 0).unwrap();
    assert_eq!(
        log.entries(),
        [
            format!("add +1 {key} = 1"),
            format!("remove {stale}"),
            "write statement".to_owned(),
            format!("add -1 {key} = 0"),
        ]
    );
    release(&path, &log, &counters, "a", 1).unwrap();
    assert_eq!(counters.value(&key), 0, "every turn was given back");
    assert_eq!(counters.value(&stale), 0, "the stale counter is gone");
}

#[test]
fn a_write_waits_while_its_org_runs_its_whole_share_and_goes_when_a_turn_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    market(&path);
    let log = Arc::new(Log::default());
    let counters = Arc::new(MemoryCounters::new(&log));
    let window = inside_a_window();
    let key = share_key("a", window);
    counters.set(&key, SHARE); // two of a's writes are running elsewhere

    std::thread::scope(|scope| {
        let writer = scope.spawn(|| release(&path, &log, counters.as_ref(), "a", 0));
        // b's write does not wait for a's share.
        release(&path, &log, counters.as_ref(), "b", 0).unwrap();
        // Once a's write has found the share full, one of the running ones ends.
        let refused = format!("add +1 {key} = {}", SHARE + 1);
        until("a's write finds its share full", || {
            log.position(&refused).is_some()
        });
        counters.add(&key, -1).unwrap();
        log.note("a turn given back".into());
        writer.join().unwrap().unwrap();
    });

    let entries = log.entries();
    let statements: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i] == "write statement")
        .collect();
    let given_back = log.position("a turn given back").unwrap();
    assert_eq!(statements.len(), 2, "{entries:#?}");
    assert!(
        statements[0] < given_back && given_back < statements[1],
        "b wrote while a waited, a only once a turn was free: {entries:#?}"
    );
    assert_eq!(counters.value(&key), SHARE - 1, "{entries:#?}");
}

#[test]
fn a_write_that_gets_no_turn_in_time_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    market(&path);
    let log = Arc::new(Log::default());
    let counters = MemoryCounters {
        full_for: Some("a"),
        ..MemoryCounters::new(&log)
    };
    let refused = release(&path, &log, &counters, "a", 0).unwrap_err();
    let StoreError::ShareExhausted { share, waited } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(share, SHARE);
    assert!(waited >= SHARE_WAIT, "{waited:?}");
    assert_eq!(log.position("write statement"), None);
    // b is served meanwhile and after.
    release(&path, &log, &counters, "b", 0).unwrap();
}

#[test]
fn operators_write_without_a_turn_and_failing_counters_let_writes_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    market(&path);
    let log = Arc::new(Log::default());
    let failing = MemoryCounters {
        failing: true,
        ..MemoryCounters::new(&log)
    };
    release(&path, &log, &failing, "a", 0).unwrap();
    assert_eq!(log.entries(), ["write statement"]);

    let counters = MemoryCounters::new(&log);
    let db = Logged {
        db: NativeDb::open(&path).unwrap(),
        log: log.clone(),
    };
    let store = Store::open(&db)
        .unwrap()
        .with_write_shares(&counters, SHARE);
    let operator = Caller::operator("operator");
    store
        .identity()
        .create_org(&ctx(&operator), "c", "c")
        .unwrap();
    assert_eq!(log.entries(), ["write statement", "write statement"]);
}
