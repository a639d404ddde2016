//! The bounded places of waiting feed polls, natively over SQLite files: polls that arrive
//! together contend for the write lock, so taking a place is retried while the database is
//! busy, and a retry whose earlier attempt landed unseen finds that place instead of taking a
//! second one.

mod faults;

use reservations_domain::time::from_millis;
use reservations_store::Store;
use reservations_store::feed::{WAITS_PER_KEY, WaitRefused};

use faults::Faulty;

const LOCKED: &str = "SQLite error: database is locked";

/// A poll at `NOW` that waits ten seconds.
const NOW: i64 = 1_800_000_000_000;
const UNTIL: i64 = NOW + 10_000;

#[test]
fn a_place_is_taken_after_the_database_was_busy() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let (now, until) = (from_millis(NOW), from_millis(UNTIL));
    db.fail_next("INSERT INTO feed_waits", LOCKED);
    let wait = store
        .begin_feed_wait("key-1", "wait-1", now, until)
        .unwrap()
        .expect("a place");
    assert_eq!(db.injected(), 1);
    assert_eq!(db.count("feed_waits"), 1);
    db.fail_next("DELETE FROM feed_waits", LOCKED);
    store.end_feed_wait(wait).unwrap();
    assert_eq!(db.count("feed_waits"), 0, "the place was given back");
}

#[test]
fn a_place_taken_by_an_attempt_whose_answer_was_lost_is_the_poll_s_one_place() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let (now, until) = (from_millis(NOW), from_millis(UNTIL));
    for held in 1..WAITS_PER_KEY {
        store
            .begin_feed_wait("key-1", &format!("held-{held}"), now, until)
            .unwrap()
            .expect("a place");
    }
    // The key's last place: the insert lands, its answer does not.
    db.lose_answer_of_next("INSERT INTO feed_waits", LOCKED);
    let wait = store
        .begin_feed_wait("key-1", "wait-last", now, until)
        .unwrap()
        .expect("the place the lost attempt took");
    assert_eq!(db.injected(), 1);
    assert_eq!(db.count("feed_waits"), WAITS_PER_KEY);
    // The key is now at its bound, with its earliest place lapsing at `until`.
    assert_eq!(
        store
            .begin_feed_wait("key-1", "wait-more", now, until)
            .unwrap()
            .map(|_| ()),
        Err(WaitRefused::KeyBusy {
            retry_after_secs: 10
        })
    );
    store.end_feed_wait(wait).unwrap();
    assert_eq!(db.count("feed_waits"), WAITS_PER_KEY - 1);
}
