//! Times relative to the real clock.

use spin_host::TimeDelta;

/// An RFC 3339 time `seconds` from the real now.
pub fn rfc3339_from_now(seconds: i64) -> String {
    (chrono::Utc::now() + TimeDelta::seconds(seconds))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Waits until `condition` holds, looking every 20 ms, and fails the test naming `what` if it
/// has not within `patience`: a test waits on the state it needs, never on a guess at how long
/// the machine takes to get there.
#[track_caller]
pub fn until(what: &str, patience: std::time::Duration, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + patience;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not so after {patience:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
