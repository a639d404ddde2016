//! An org's share of the writes (docs/design.md, "One org's share of the writes"): at most
//! `share` write statements of one org run at once (the app's `org_write_share`). The
//! database has one write lock and queues (sqld) or polls (SQLite's busy handler) for it;
//! without shares, an org that sends many writes at once fills that queue, and every other
//! org's write waits behind all of them. With them, the others wait behind at most `share`
//! of that org's, and the org's further writes wait here, off the database, holding nothing.
//!
//! The count lives in the app's key-value store ([`Counters`]), shared by every request and
//! replica that shares that store, as counters moved only by atomic increments. A counter is
//! kept per org and per [`WINDOW_SECS`] window of the wall clock, and a statement counts in
//! the window it started in, so a turn that a killed request never gave back is forgotten
//! with its window. The price: for a moment after each window turns, an org may run up to
//! twice its share. The first turn of a window removes the counter of the window before
//! last, so the store keeps about two counters per org that writes.
//!
//! A turn not given within [`SHARE_WAIT`] is a 503 `write-contention`: nothing was written.
//! A key-value store that fails lets the write go without a turn: the share protects other
//! orgs' latency, it decides no rule, and is not worth failing a write for.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::storage::Counters;
use crate::storage::{SHARE_WAIT, share_backoff};
use crate::{Context, Result, Store, StoreError};

/// The share the app's deployments at the edge use: enough to keep the write lock busy for
/// one org on its own (a write statement there is a round trip to the primary); few enough
/// that another org's write waits behind a handful of its statements, not behind all of them.
pub const EDGE_WRITE_SHARE: i64 = 8;

/// How many of one token's events-feed requests the edge deployments run at once: twice the
/// places a key may hold waiting ([`crate::feed::WAITS_PER_KEY`]), so that its polls that
/// find events at once never keep its waiting ones out.
pub const EDGE_FEED_REQUESTS_PER_TOKEN: i64 = 2 * crate::feed::WAITS_PER_KEY;

/// The length of a counter's window, in seconds of the wall clock.
pub const WINDOW_SECS: u64 = 10;

/// Where the shares are counted, and how many write statements each org may run at once.
#[derive(Clone, Copy)]
pub(crate) struct Shares<'a> {
    pub(crate) counters: &'a dyn Counters,
    pub(crate) share: i64,
}

/// One turn counted in the key-value store (a write statement's place in its org's share, a
/// feed request's in its token's), given back when dropped.
pub struct Turn<'a> {
    counters: &'a dyn Counters,
    key: String,
    window: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // A turn taken two windows ago counts no more, and its counter is being removed.
        if window_now() >= self.window + 2 {
            return;
        }
        if let Err(e) = self.counters.add(&self.key, -1) {
            eprintln!("could not give back a write turn at {}: {e}", self.key);
        }
    }
}

/// The window of the wall clock a write statement starting now counts in.
pub fn window_now() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    since_epoch.as_secs() / WINDOW_SECS
}

/// The counter of `org`'s write statements that started in `window`.
pub fn share_key(org: &str, window: u64) -> String {
    format!("write-share/{org}/{window}")
}

/// The counter of one bearer token's events-feed requests that started in `window`, named by
/// the token's SHA-256 (`token_hash`, hex), so the store holds no secret.
pub fn feed_admission_key(token_hash: &str, window: u64) -> String {
    format!("feed-admission/{token_hash}/{window}")
}

/// What trying for a turn found.
pub(crate) enum Taking<'a> {
    Taken(Turn<'a>),
    /// Every turn was taken; `ahead` is how many were waiting before this one.
    Full {
        ahead: i64,
    },
    /// The counters failed.
    Unavailable(crate::StorageError),
}

/// Takes one of `limit` turns of the counter `key_of` names for the window now, if one is
/// free. The first turn of a window removes the counter of the window before last.
pub(crate) fn try_turn<'a>(
    counters: &'a dyn Counters,
    key_of: impl Fn(u64) -> String,
    limit: i64,
) -> Taking<'a> {
    let window = window_now();
    let key = key_of(window);
    match counters.add(&key, 1) {
        Ok(taken) if taken <= limit => {
            if taken == 1 {
                let stale = key_of(window.saturating_sub(2));
                if let Err(e) = counters.remove(&stale) {
                    eprintln!("could not remove the turn counter {stale}: {e}");
                }
            }
            Taking::Taken(Turn {
                counters,
                key,
                window,
            })
        }
        Ok(taken) => {
            if let Err(e) = counters.add(&key, -1) {
                eprintln!("could not give back a turn at {key}: {e}");
            }
            Taking::Full {
                ahead: taken - limit,
            }
        }
        Err(e) => Taking::Unavailable(e),
    }
}

/// The seconds until the window now turns, when every turn counted in it is forgotten: at
/// least 1.
pub fn seconds_until_window_turns() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (WINDOW_SECS - since_epoch.as_secs() % WINDOW_SECS).max(1)
}

impl Store<'_> {
    /// Waits for a turn in the share of the writer's org; `None` for an operator (no org),
    /// for a store without shares, or if the counters failed.
    pub(crate) fn write_turn(&self, ctx: &Context<'_>) -> Result<Option<Turn<'_>>> {
        let (Some(Shares { counters, share }), Some(org)) =
            (self.shares, ctx.caller.org_id.as_deref())
        else {
            return Ok(None);
        };
        let started = Instant::now();
        loop {
            let window = window_now();
            let key = share_key(org, window);
            // How many of the org's writes were waiting before this one when it tried.
            let ahead = match try_turn(counters, |window| share_key(org, window), share) {
                Taking::Taken(turn) => {
                    crate::storage::Tally::waited_for_share(started.elapsed());
                    return Ok(Some(turn));
                }
                Taking::Full { ahead } => ahead,
                Taking::Unavailable(e) => {
                    eprintln!("write shares unavailable, writing without a turn: {e}");
                    return Ok(None);
                }
            };
            // Watch the counter (a read) until it has room, rather than taking and giving back
            // a turn over and over; the further back in line, the less often.
            loop {
                if started.elapsed() >= SHARE_WAIT {
                    crate::storage::Tally::waited_for_share(started.elapsed());
                    return Err(StoreError::ShareExhausted {
                        share,
                        waited: started.elapsed(),
                    });
                }
                std::thread::sleep(share_backoff(ahead));
                if window_now() != window {
                    break;
                }
                match counters.read(&key) {
                    Ok(running) if running >= share => {}
                    _ => break,
                }
            }
        }
    }
}

/// Why a token's events-feed request was not admitted: all of its turns are taken, until the
/// window turns at the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedAdmissionRefused {
    pub retry_after_secs: u64,
}

/// Admits one events-feed request of the token whose SHA-256 is `token_hash`, if fewer than
/// `limit` of its requests are running (docs/design.md, "The events feed"): counted in the
/// key-value store before the request touches the database, so a token's flood of polls
/// costs the database nothing. Its turn is given back when the returned value is dropped;
/// counters that fail admit the request without a turn (the places in SQL still bound it).
pub fn admit_feed_request<'a>(
    counters: &'a dyn Counters,
    token_hash: &str,
    limit: i64,
) -> std::result::Result<Option<Turn<'a>>, FeedAdmissionRefused> {
    match try_turn(
        counters,
        |window| feed_admission_key(token_hash, window),
        limit,
    ) {
        Taking::Taken(turn) => Ok(Some(turn)),
        Taking::Full { .. } => Err(FeedAdmissionRefused {
            retry_after_secs: seconds_until_window_turns(),
        }),
        Taking::Unavailable(e) => {
            eprintln!("feed admission unavailable, admitting without a turn: {e}");
            Ok(None)
        }
    }
}
