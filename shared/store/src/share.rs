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

use crate::retry::{SHARE_WAIT, share_backoff};
use crate::storage::Counters;
use crate::{Context, Result, Store, StoreError};

/// The share the app's deployments at the edge use: enough to keep the write lock busy for
/// one org on its own (a write statement there is a round trip to the primary); few enough
/// that another org's write waits behind a handful of its statements, not behind all of them.
pub const EDGE_WRITE_SHARE: i64 = 8;

/// The length of a counter's window, in seconds of the wall clock.
pub const WINDOW_SECS: u64 = 10;

/// Where the shares are counted, and how many write statements each org may run at once.
#[derive(Clone, Copy)]
pub(crate) struct Shares<'a> {
    pub(crate) counters: &'a dyn Counters,
    pub(crate) share: i64,
}

/// One write statement's place in its org's share, given back when dropped.
pub(crate) struct Turn<'a> {
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
            let ahead = match counters.add(&key, 1) {
                Ok(taken) if taken <= share => {
                    if taken == 1 {
                        let stale = share_key(org, window.saturating_sub(2));
                        if let Err(e) = counters.remove(&stale) {
                            eprintln!("could not remove the write share counter {stale}: {e}");
                        }
                    }
                    return Ok(Some(Turn {
                        counters,
                        key,
                        window,
                    }));
                }
                Ok(taken) => {
                    if let Err(e) = counters.add(&key, -1) {
                        eprintln!("could not give back a write turn at {key}: {e}");
                    }
                    taken - share
                }
                Err(e) => {
                    eprintln!("write shares unavailable, writing without a turn: {e}");
                    return Ok(None);
                }
            };
            // Watch the counter (a read) until it has room, rather than taking and giving back
            // a turn over and over; the further back in line, the less often.
            loop {
                if started.elapsed() >= SHARE_WAIT {
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
