//! What the events feed needs beyond the audit listing: where the trail the caller may see
//! ends (and whether its key still holds), and the bounded places of polls that wait.
//!
//! A waiting poll holds an instance for up to its `wait`; without a bound one key could hold
//! every instance a replica has and starve every other caller. So a poll that has to wait
//! first takes a place ([`Feed::begin_feed_wait`]): at most [`WAITS_PER_KEY`] per key,
//! [`WAITS_PER_ORG`] per org (an org mints keys at will, so the key's bound alone would let
//! one org hold them all) and [`WAITS_OVERALL`] over the deployment, counted and taken in one
//! statement. The place is given back when the poll answers; one whose instance was stopped
//! lapses at the latest time that poll could have answered.

use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, may_read_events};

use crate::audit::{AuditFilter, FEED_ACTIONS, Listed};
use crate::storage::retry_transient;
use crate::storage::{SqlValue, StorageError};
use crate::storage::{exec, first_row, millis, text};
use crate::{Feed, Page, Result};

const EVENTS_FORBIDDEN: &str =
    "reading the events feed needs audit.read, vm.read or reservation.read";

/// Polls of one key that may wait at once.
pub const WAITS_PER_KEY: i64 = 4;
/// Polls of one org's keys (or of the operators' keys together) that may wait at once: a
/// quarter of [`WAITS_OVERALL`], so that no org, however many keys it mints, holds more than a
/// quarter of the places, and other orgs' polls still find one.
pub const WAITS_PER_ORG: i64 = 16;
/// Polls that may wait at once over the whole deployment. A waiting poll holds an instance
/// (Spin's default pool holds 1 000 per replica) and its database connection (sqld serves
/// 128 at once by default), so this stays at half the smaller: waits never crowd out
/// requests.
pub const WAITS_OVERALL: i64 = 64;

/// Where the trail the caller may see ends, looked at between a waiting poll's reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedHead {
    /// Whether the caller's key is still valid (a key revoked meanwhile ends its poll).
    pub key_valid: bool,
    /// The last event the caller may see (all of it or its own part), 0 if none: an org
    /// learns nothing of events it may not see, not even how many there are.
    pub seq: i64,
}

/// A place a waiting poll holds; give it back with [`Feed::end_feed_wait`].
#[derive(Debug)]
pub struct FeedWait {
    id: String,
}

/// Who asks for a place, and the place's id.
struct Waiter<'a> {
    key_id: &'a str,
    org_id: Option<&'a str>,
    id: &'a str,
}

/// Why a poll may not wait now, and when a place is sure to be free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitRefused {
    /// The key already holds [`WAITS_PER_KEY`] places.
    KeyBusy { retry_after_secs: u64 },
    /// The key's org already holds [`WAITS_PER_ORG`] places.
    OrgBusy { retry_after_secs: u64 },
    /// The deployment already holds [`WAITS_OVERALL`] places.
    ServiceBusy { retry_after_secs: u64 },
}

impl Feed<'_, '_> {
    /// The caller's feed head: one read, a primary-key probe of the events it may see and of
    /// its key (which only the directory holds).
    pub fn feed_head(&self, caller: &Caller, bootstrap_key_id: &str) -> Result<FeedHead> {
        may_read_events(caller).enforce("events", EVENTS_FORBIDDEN)?;
        let key_valid = if caller.key_id == bootstrap_key_id {
            "?1 IS NOT NULL"
        } else if caller.is_operator() {
            "EXISTS (SELECT 1 FROM operator_keys WHERE id = ?1 AND revoked_at IS NULL)"
        } else {
            "EXISTS (SELECT 1 FROM api_keys WHERE id = ?1 AND revoked_at IS NULL)"
        };
        let (key_valid, seq) = self.head_with(caller, key_valid)?;
        Ok(FeedHead { key_valid, seq })
    }

    /// The newest event of this database's trail that `caller` may see (0 for none): the
    /// feed's head in a cell other than the directory's.
    pub fn events_head(&self, caller: &Caller) -> Result<i64> {
        may_read_events(caller).enforce("events", EVENTS_FORBIDDEN)?;
        Ok(self.head_with(caller, "?1 IS NOT NULL")?.1)
    }

    /// One read of the head, beside the `key_valid` expression of the caller's key (`?1`):
    /// whether the key holds, and the head.
    fn head_with(&self, caller: &Caller, key_valid: &str) -> Result<(bool, i64)> {
        let head = match caller.org_id {
            None => "(SELECT MAX(seq) FROM audit_events WHERE ?2 IS NULL)",
            // Bounded above, so that a damaged row (a blob or text sorts after every
            // integer) is never taken for the head.
            Some(_) => {
                "(SELECT MAX(seq) FROM audit_visibility \
                  WHERE org_id = ?2 AND seq <= 9223372036854775807)"
            }
        };
        let result = exec(
            self.db(),
            &format!("SELECT {key_valid} AS key_valid, COALESCE({head}, 0) AS seq"),
            &[
                text(&caller.key_id),
                caller.org_id.clone().map(SqlValue::Text).into(),
            ],
        )?;
        let row = first_row(&result).ok_or_else(no_row)?;
        Ok((row.int("key_valid")? == 1, row.int("seq")?))
    }

    /// The feed's events the caller may see after `after` up to `up_to` (its head), at most
    /// `limit`.
    pub fn read_feed(
        &self,
        caller: &Caller,
        after: i64,
        up_to: i64,
        limit: usize,
    ) -> Result<Page<Listed>> {
        may_read_events(caller).enforce("events", EVENTS_FORBIDDEN)?;
        self.trail().list_audit(&AuditFilter {
            visible_to_org: caller.org_id.clone(),
            after_seq: Some(after),
            up_to_seq: Some(up_to),
            actions: FEED_ACTIONS,
            limit,
            ..AuditFilter::default()
        })
    }

    /// Takes a place for a poll of `key_id` (of the org `org_id`, `None` for an operator's
    /// key) that waits until `until` at the latest, if every bound allows.
    ///
    /// The bounds are read first, so that a poll they refuse (the many of a burst) writes
    /// nothing and never queues for the write lock; a poll they allow takes its place with
    /// one insert that counts again under the lock. Many polls arriving at once contend for
    /// that lock, so a transient failure is retried; the place's id makes a retry after an
    /// attempt that landed unseen find that place instead of taking a second.
    pub fn begin_feed_wait(
        &self,
        key_id: &str,
        org_id: Option<&str>,
        id: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<std::result::Result<FeedWait, WaitRefused>> {
        let waiter = Waiter { key_id, org_id, id };
        retry_transient(|| self.try_feed_wait(&waiter, now, until))
    }

    /// Whether a bound refuses the caller a place now: one read of the directory. A poll
    /// that means to wait asks it before it reads any cell, so that a flood of one key's
    /// polls is refused for the price of the key's look-up and this read, whatever the number
    /// of cells.
    pub fn feed_wait_refused(
        &self,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<Option<WaitRefused>> {
        may_read_events(caller).enforce("events", EVENTS_FORBIDDEN)?;
        let waiter = Waiter {
            key_id: &caller.key_id,
            org_id: caller.org_id.as_deref(),
            id: "",
        };
        Ok(retry_transient(|| self.feed_wait_refusal(&waiter, now))?.and_then(Result::err))
    }

    fn try_feed_wait(
        &self,
        waiter: &Waiter<'_>,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<std::result::Result<FeedWait, WaitRefused>> {
        let place = |()| FeedWait {
            id: waiter.id.to_owned(),
        };
        if let Some(outcome) = self.feed_wait_refusal(waiter, now)? {
            return Ok(outcome.map(place));
        }
        let held = "FROM feed_waits WHERE until > ?4";
        let result = exec(
            self.db(),
            &format!(
                "INSERT INTO feed_waits (id, key_id, org_id, started_at, until) \
                 SELECT ?1, ?2, ?3, ?4, ?5 \
                 WHERE (SELECT COUNT(*) {held} AND key_id = ?2) < ?6 \
                   AND (SELECT COUNT(*) {held} AND org_id IS ?3) < ?7 \
                   AND (SELECT COUNT(*) {held}) < ?8 \
                 ON CONFLICT (id) DO NOTHING \
                 RETURNING id"
            ),
            &[
                text(waiter.id),
                text(waiter.key_id),
                waiter.org_id.map(str::to_owned).into(),
                millis(now),
                millis(until),
                SqlValue::Integer(WAITS_PER_KEY),
                SqlValue::Integer(WAITS_PER_ORG),
                SqlValue::Integer(WAITS_OVERALL),
            ],
        )?;
        if first_row(&result).is_some() {
            return Ok(Ok(place(())));
        }
        // Not inserted: an earlier attempt took the place, or a bound refuses now.
        match self.feed_wait_refusal(waiter, now)? {
            Some(outcome) => Ok(outcome.map(place)),
            None => Err(StorageError::Busy(
                "the places of waiting polls changed between the count and the insert".into(),
            )
            .into()),
        }
    }

    /// Whether the waiter holds its place already (`Ok`), or a bound refuses it (which one,
    /// and when its earliest place lapses at the latest); `None` when it may take one. One
    /// read.
    fn feed_wait_refusal(
        &self,
        waiter: &Waiter<'_>,
        now: Timestamp,
    ) -> Result<Option<std::result::Result<(), WaitRefused>>> {
        let held = "FROM feed_waits WHERE until > ?4";
        let result = exec(
            self.db(),
            &format!(
                "SELECT EXISTS (SELECT 1 FROM feed_waits WHERE id = ?1) AS taken, \
                   (SELECT COUNT(*) {held} AND key_id = ?2) AS mine, \
                   (SELECT MIN(until) {held} AND key_id = ?2) AS mine_until, \
                   (SELECT COUNT(*) {held} AND org_id IS ?3) AS org, \
                   (SELECT MIN(until) {held} AND org_id IS ?3) AS org_until, \
                   (SELECT COUNT(*) {held}) AS every, \
                   (SELECT MIN(until) {held}) AS any_until"
            ),
            &[
                text(waiter.id),
                text(waiter.key_id),
                waiter.org_id.map(str::to_owned).into(),
                millis(now),
            ],
        )?;
        let row = first_row(&result).ok_or_else(no_row)?;
        if row.int("taken")? == 1 {
            return Ok(Some(Ok(())));
        }
        let seconds_until = |column: &str| -> Result<u64> {
            let at = row.opt_int(column)?.unwrap_or(now.timestamp_millis());
            Ok(((at - now.timestamp_millis()).max(0) as u64)
                .div_ceil(1000)
                .max(1))
        };
        let refused = if row.int("mine")? >= WAITS_PER_KEY {
            WaitRefused::KeyBusy {
                retry_after_secs: seconds_until("mine_until")?,
            }
        } else if row.int("org")? >= WAITS_PER_ORG {
            WaitRefused::OrgBusy {
                retry_after_secs: seconds_until("org_until")?,
            }
        } else if row.int("every")? >= WAITS_OVERALL {
            WaitRefused::ServiceBusy {
                retry_after_secs: seconds_until("any_until")?,
            }
        } else {
            return Ok(None);
        };
        Ok(Some(Err(refused)))
    }

    /// Gives a waiting poll's place back.
    pub fn end_feed_wait(&self, wait: FeedWait) -> Result<()> {
        retry_transient(|| {
            exec(
                self.db(),
                "DELETE FROM feed_waits WHERE id = ?",
                &[text(&wait.id)],
            )?;
            Ok(())
        })
    }
}

fn no_row() -> StorageError {
    StorageError::Other("a SELECT without FROM answered no row".into())
}
