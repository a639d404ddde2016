//! The bounded places of waiting feed polls, natively over SQLite files: polls that arrive
//! together contend for the write lock, so taking a place is retried while the database is
//! busy, and a retry whose earlier attempt landed unseen finds that place instead of taking a
//! second one; a poll the bounds refuse writes nothing; and an org's keys together hold at
//! most their org's share of the places, however many keys it has.

mod faults;

use reservations_domain::time::from_millis;
use reservations_store::Store;
use reservations_store::feed::{WAITS_OVERALL, WAITS_PER_KEY, WAITS_PER_ORG, WaitRefused};

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
        .feed()
        .begin_feed_wait("key-1", Some("org-1"), "wait-1", now, until)
        .unwrap()
        .expect("a place");
    assert_eq!(db.injected(), 1);
    assert_eq!(db.count("feed_waits"), 1);
    db.fail_next("DELETE FROM feed_waits", LOCKED);
    store.feed().end_feed_wait(wait).unwrap();
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
            .feed()
            .begin_feed_wait("key-1", Some("org-1"), &format!("held-{held}"), now, until)
            .unwrap()
            .expect("a place");
    }
    // The key's last place: the insert lands, its answer does not.
    db.lose_answer_of_next("INSERT INTO feed_waits", LOCKED);
    let wait = store
        .feed()
        .begin_feed_wait("key-1", Some("org-1"), "wait-last", now, until)
        .unwrap()
        .expect("the place the lost attempt took");
    assert_eq!(db.injected(), 1);
    assert_eq!(db.count("feed_waits"), WAITS_PER_KEY);
    // The key is now at its bound, with its earliest place lapsing at `until`.
    assert_eq!(
        store
            .feed()
            .begin_feed_wait("key-1", Some("org-1"), "wait-more", now, until)
            .unwrap()
            .map(|_| ()),
        Err(WaitRefused::KeyBusy {
            retry_after_secs: 10
        })
    );
    store.feed().end_feed_wait(wait).unwrap();
    assert_eq!(db.count("feed_waits"), WAITS_PER_KEY - 1);
}

#[test]
fn an_org_s_keys_together_hold_at_most_the_org_s_places_and_a_refusal_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Faulty::open(dir.path().join("db.sqlite"));
    let store = Store::open(&db).unwrap();
    let (now, until) = (from_millis(NOW), from_millis(UNTIL));
    let take = |key: &str, org: Option<&str>, id: &str| {
        store
            .feed()
            .begin_feed_wait(key, org, id, now, until)
            .unwrap()
            .map(|_| ())
    };
    // One org, as many keys as it likes, each within its own bound: the org's share is all
    // they get together.
    for place in 0..WAITS_PER_ORG {
        let key = format!("key-{}", place / WAITS_PER_KEY);
        assert_eq!(
            take(&key, Some("busy-org"), &format!("busy-{place}")),
            Ok(())
        );
    }
    // A refusal is a read alone: the insert that would take a place fails the test if sent.
    db.fail_next("INSERT INTO feed_waits", "refused inserts are never sent");
    assert_eq!(
        take("key-fresh", Some("busy-org"), "busy-more"),
        Err(WaitRefused::OrgBusy {
            retry_after_secs: 10
        })
    );
    assert_eq!(db.injected(), 0, "a refused poll sent an insert");
    // The fault is spent by the next poll that may wait: another org's, which the insert's
    // failure (a plain error) fails; its poll after that takes the place.
    assert!(
        store
            .feed()
            .begin_feed_wait("key-other", Some("other-org"), "other-0", now, until)
            .is_err()
    );
    assert_eq!(take("key-other", Some("other-org"), "other-0"), Ok(()));
    // The operators' keys share one bound too.
    for place in 0..WAITS_PER_ORG {
        let key = format!("op-{}", place / WAITS_PER_KEY);
        assert_eq!(take(&key, None, &format!("op-{place}")), Ok(()));
    }
    assert_eq!(
        take("op-fresh", None, "op-more"),
        Err(WaitRefused::OrgBusy {
            retry_after_secs: 10
        })
    );
    // Over the deployment, the bound holds whoever asks.
    let mut orgs = 0;
    while db.count("feed_waits") < WAITS_OVERALL {
        orgs += 1;
        for place in 0..WAITS_PER_KEY {
            let id = format!("fill-{orgs}-{place}");
            if db.count("feed_waits") < WAITS_OVERALL {
                assert_eq!(
                    take(&format!("fill-{orgs}"), Some(&format!("org-{orgs}")), &id),
                    Ok(())
                );
            }
        }
    }
    assert_eq!(
        take("key-last", Some("last-org"), "last"),
        Err(WaitRefused::ServiceBusy {
            retry_after_secs: 10
        })
    );
}
