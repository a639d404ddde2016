//! Where the store reads (docs/design.md, "Edge sites" and "Writes at home"): at its site,
//! whose copy may lag behind the primary.
//!
//! At an edge site the app's database is a libSQL read replica, which serves reads from its
//! own copy; writes run at home, beside the primary, and reach the copy by replication. Local
//! files and a lone libSQL server are the primary itself: what the store reads there is never
//! behind a write.
//!
//! - **Which it is** ([`Store::copy_may_lag`]): asked of the database once (a write on a table
//!   that does not exist fails at a replica with sqld's message for a statement that failed
//!   on the primary) and remembered in the app's key-value store for [`SITE_REMEMBERED_FOR`],
//!   so a request pays a key-value read for it, not a statement. Whatever the probe cannot
//!   tell counts as a copy that may lag, and no write runs on such a database.
//! - A **position** is how far the database has come: the sequence number of the newest
//!   audit event, since every write appends one and they commit in that order. A write's
//!   statement returns its event's position; the position of a copy is its newest event's.
//! - **Read-your-writes at a site**: a write forwarded to its home is answered once the
//!   site's copy has reached the position the home answered ([`Store::await_copy`]), so every
//!   later request through that site sees it. sqld 0.24's replica forwards every program of a
//!   connection, reads too, once one of that connection's answers was cut short (the client
//!   stops reading at the end of the statement's rows, which cancels the replica's work
//!   before it has marked the connection free of a transaction). So at a replica every
//!   statement after a request's first runs on a connection of its own
//!   ([`crate::storage::Sql::next_on_a_new_connection`]): each read is the copy's.
//!
//! Migrations are applied only where writes are not forwarded ([`probe_forwarding`]).

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Result;
use crate::Store;
use crate::storage::{KeyValue, Lacking, Sql, StorageError};
use crate::storage::{exec, first_row};

/// How long a write's answer waits for the site's copy to reach the write. Replication takes
/// about one one-way trip from the primary; past this bound the copy is cut off from it, and
/// the write (committed at the primary) is answered anyway, with its bookmark.
pub const COPY_REACHES_WRITE_WITHIN: Duration = Duration::from_secs(10);

/// How long a request that sends a bookmark waits for the site's copy to reach it. A read
/// that it does not reach is refused (503, `site-behind`) rather than answered from older
/// state; a write is planned on the copy as it is, since its statement checks every fact it
/// depends on at the primary.
pub(crate) const BOOKMARK_WAIT: Duration = Duration::from_secs(2);

/// How long what the probe found of the database (whether it forwards writes) is trusted. A
/// deployment that repoints its app from a primary to a replica, keeping its key-value store,
/// answers forwarded writes without waiting for the copy, and an app moved the other way
/// refuses writes, for at most this long. The probe is a statement a replica sends to the
/// primary (it writes nothing): ten minutes keep it off the first write after an idle while
/// (docs/benchmarks.md, "Writes at home").
pub const SITE_REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// Where the probe's finding about the `default` database is kept: `forwards <0|1> <probed
/// at, ms since the epoch>`.
pub const SITE_MEMORY_KEY: &str = "site/default/forwards-writes";

/// Where the probe's finding about the database labelled `label` is kept.
pub fn site_memory_key(label: &str) -> String {
    format!("site/{label}/forwards-writes")
}

/// Where a database stands against a bookmark's position ([`Store::bookmark_reach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookmarkReach {
    Reached,
    NotInTime,
    AheadOfThePrimary,
}

/// What a store knows of its database's place: whether it forwards writes, found once per
/// request at most, and where that is remembered between requests.
#[derive(Default)]
pub(crate) struct Site<'a> {
    /// Where the finding is remembered: the store, and the key of this database's finding.
    pub(crate) memory: Option<(&'a dyn KeyValue, String)>,
    forwards_writes: Cell<Option<bool>>,
}

/// The positions a request has seen, for its bookmark.
#[derive(Debug, Default)]
pub(crate) struct Seen(Cell<i64>);

impl Seen {
    pub(crate) fn at_least(&self, position: i64) {
        self.0.set(self.0.get().max(position));
    }
}

impl Store<'_> {
    /// Whether the database this store reads is a copy that may lag behind the primary (an
    /// edge site's replica): see the module's comment. Unknown counts as yes.
    pub(crate) fn copy_may_lag(&self) -> bool {
        let site = &self.site;
        if let Some(known) = site.forwards_writes.get() {
            return known;
        }
        let now = millis_since_epoch();
        let remembered = site
            .memory
            .as_ref()
            .and_then(|(memory, key)| memory.get(key).ok().flatten())
            .and_then(|value| remembered_finding(&value, now));
        let forwards = match remembered {
            Some(forwards) => forwards,
            None => match probe_forwarding(self.connection.unmanaged()) {
                Some(forwards) => {
                    if let Some((memory, key)) = &site.memory {
                        let value = format!("forwards {} {now}", u8::from(forwards));
                        if let Err(e) = memory.set(key, value.as_bytes()) {
                            eprintln!(
                                "could not remember whether the database forwards writes: {e}"
                            );
                        }
                    }
                    forwards
                }
                None => return true,
            },
        };
        site.forwards_writes.set(Some(forwards));
        forwards
    }

    /// How far the database this store reads has come: its newest event's position (0 for
    /// an empty trail). One probe of the primary key.
    pub fn latest_position(&self) -> Result<i64> {
        let result = exec(
            self.db(),
            "SELECT COALESCE(MAX(seq), 0) AS seq FROM audit_events",
            &[],
        )?;
        Ok(match first_row(&result) {
            Some(row) => row.int("seq")?,
            None => 0,
        })
    }

    /// The position a client must be served at least, to see everything this request did or
    /// saw: its write's, else what the database it read has reached now.
    pub fn bookmark_position(&self) -> Result<i64> {
        match self.seen.0.get() {
            0 => self.latest_position(),
            seen => Ok(seen),
        }
    }

    /// The newest position this request wrote or caught up to here (0: none).
    pub fn seen_position(&self) -> i64 {
        self.seen.0.get()
    }

    /// Whether the database this store reads has come as far as `position`.
    fn has_reached(&self, position: i64) -> Result<bool> {
        Ok(self.latest_position()? >= position)
    }

    /// Where the database this store reads stands against `position`, a bookmark's: reached
    /// (at once, or within [`BOOKMARK_WAIT`] at a copy that may lag), not reached in time, or
    /// ahead of the primary itself (a database restored from a backup older than the
    /// bookmark), so never answered by it.
    pub fn bookmark_reach(&self, position: i64) -> Result<BookmarkReach> {
        if self.has_reached(position)? {
            return Ok(BookmarkReach::Reached);
        }
        if !self.copy_may_lag() {
            return Ok(BookmarkReach::AheadOfThePrimary);
        }
        let mut wait = CopyWait::new(BOOKMARK_WAIT);
        while wait.pause() {
            if self.has_reached(position)? {
                return Ok(BookmarkReach::Reached);
            }
        }
        Ok(BookmarkReach::NotInTime)
    }

    /// The wait for a site's copy to have what a request looked for and did not find (a key
    /// made a moment ago at another site): as long as a bookmark is waited for. None on the
    /// primary itself, where what was found the first time stands.
    pub fn wait_for_the_copy(&self) -> Option<CopyWait> {
        self.copy_may_lag().then(|| CopyWait::new(BOOKMARK_WAIT))
    }

    /// Waits until the site's copy has a write its home committed at `position`
    /// (read-your-writes at a site), at most [`COPY_REACHES_WRITE_WITHIN`]; whether it has.
    /// A database that is the primary itself has it at once, and is not asked.
    pub fn await_copy(&self, position: i64) -> Result<bool> {
        if !self.copy_may_lag() {
            return Ok(true);
        }
        poll_until(COPY_REACHES_WRITE_WITHIN, || self.has_reached(position))
    }
}

/// Whether the database forwards write statements to a primary (an edge site's read
/// replica), if the probe can tell: a write on a table that does not exist fails there with
/// sqld's message for a statement that failed on the primary, and on the primary itself with
/// SQLite's own. Any other failure (the primary out of reach) tells nothing. One statement,
/// an exchange with the primary at a replica; it writes nothing anywhere.
pub(crate) fn probe_forwarding(db: &dyn Sql) -> Option<bool> {
    match db.execute(
        "INSERT INTO site_probe_no_such_table (probe) VALUES (NULL)",
        &[],
    ) {
        Err(e) if e.forwarded() => Some(true),
        Err(StorageError::Behind(Lacking::Table, _)) => Some(false),
        Err(_) => None,
        Ok(_) => Some(false),
    }
}

/// What a remembered finding says, while it is fresh at `now`.
fn remembered_finding(value: &[u8], now: i64) -> Option<bool> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.strip_prefix("forwards ")?.split(' ');
    let forwards = match words.next()? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let probed_at: i64 = words.next()?.parse().ok()?;
    let age = now.checked_sub(probed_at)?;
    (0..SITE_REMEMBERED_FOR.as_millis() as i64)
        .contains(&age)
        .then_some(forwards)
}

fn millis_since_epoch() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Asks `reached` again, with growing pauses (1 ms doubling to 50 ms), until it says yes or
/// `within` has passed; whether it said yes.
pub fn poll_until<E>(
    within: Duration,
    mut reached: impl FnMut() -> Result<bool, E>,
) -> Result<bool, E> {
    let mut wait = CopyWait::new(within);
    loop {
        if reached()? {
            return Ok(true);
        }
        if !wait.pause() {
            return Ok(false);
        }
    }
}

const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// A wait for a site's copy, looked at between pauses by whoever waits:
/// `while wait.pause() { look }`. The time waited is tallied when it ends.
pub struct CopyWait {
    started: Instant,
    deadline: Instant,
    pause: Duration,
}

impl CopyWait {
    fn new(within: Duration) -> CopyWait {
        let started = Instant::now();
        CopyWait {
            started,
            deadline: started + within,
            pause: FIRST_PAUSE,
        }
    }

    /// Pauses before the next look (a little longer each time); false once the wait is over.
    pub fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        std::thread::sleep(self.pause.min(self.deadline - now));
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        true
    }
}

impl Drop for CopyWait {
    fn drop(&mut self) {
        crate::storage::Tally::waited_for_copy(self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_is_trusted_while_fresh_and_only_as_written() {
        let now = 1_800_000_000_000;
        let trusted_for = SITE_REMEMBERED_FOR.as_millis() as i64;
        assert_eq!(
            remembered_finding(b"forwards 1 1800000000000", now),
            Some(true)
        );
        assert_eq!(
            remembered_finding(
                format!("forwards 0 {}", now - trusted_for + 1).as_bytes(),
                now
            ),
            Some(false)
        );
        for stale_or_odd in [
            format!("forwards 0 {}", now - trusted_for),
            format!("forwards 0 {}", now + 1),
            "forwards 2 1800000000000".to_owned(),
            "forwards 1".to_owned(),
            "1 1800000000000".to_owned(),
            String::new(),
        ] {
            assert_eq!(
                remembered_finding(stale_or_odd.as_bytes(), now),
                None,
                "{stale_or_odd}"
            );
        }
    }
}
