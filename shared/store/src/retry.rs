//! Every retry of the store, in one place: what is tried again, how often, and how long it
//! waits in between.
//!
//! - **Transient failures** (the database busy, or briefly unreachable): the same work again,
//!   after a growing, jittered [`backoff`], at most [`BUSY_ATTEMPTS`] or
//!   [`UNAVAILABLE_ATTEMPTS`] times. Reads are run again by the connection
//!   ([`crate::connection`]), migrations by their transaction ([`crate::tx`]), and a write by
//!   its loop ([`crate::write`]), which first looks whether a write whose answer was lost
//!   landed.
//! - **Conflicts** (a fact a write's plan read moved before its statement ran): planned again
//!   from fresh facts after a short [`conflict_backoff`], at most [`WRITE_ATTEMPTS`] times, then
//!   refused as contention.
//! - **A duplicate under the same `Idempotency-Key`** recorded meanwhile: the key is looked up
//!   again, at most [`KEYED_LOOKUPS`] times.
//! - **A turn in the org's share of the writes** ([`crate::share`]): looked for again after
//!   [`share_backoff`], for at most [`SHARE_WAIT`], then refused as contention.
//! - **Spin's local key-value store locked** by another instance: the operation again after
//!   [`key_value_backoff`], at most [`KEY_VALUE_LOCKED_ATTEMPTS`] times (the components'
//!   adapter, `shared/http/src/spin_store.rs`).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::storage::StorageError;
use crate::{Result, StoreError};

/// How often work is tried while the database is busy.
pub const BUSY_ATTEMPTS: u32 = 12;
/// How often it is tried while the store cannot be reached: an unreachable store is
/// answered soon (503 with `Retry-After`) rather than waited for.
pub const UNAVAILABLE_ATTEMPTS: u32 = 3;

/// How often a mutation is planned and written while the facts it read keep moving. Each
/// conflict means another write that changed one of them committed, so with `n` writers on
/// the same unit the last of them waits about `n` rounds, and more when fresh writers keep
/// winning: 16 writers on one unit, 10 writes each, needed at most 33 to 49 attempts for a
/// write over ten runs on 2 cores (`write_races`), so the bound is twice that.
pub const WRITE_ATTEMPTS: u32 = 96;

/// How often a keyed request looks its key up again after a duplicate recorded it meanwhile
/// (its own write was then refused whole).
pub const KEYED_LOOKUPS: u32 = 3;

/// How often a key-value operation is tried while Spin's local store reports itself locked.
pub const KEY_VALUE_LOCKED_ATTEMPTS: u32 = 8;

/// How long to wait before key-value attempt `attempt + 1`: 4 ms doubling (to 512 ms before
/// the last).
pub fn key_value_backoff(attempt: u32) -> Duration {
    Duration::from_millis(2u64 << attempt.min(8))
}

/// How long a write waits for a turn in its org's share before it is refused.
pub const SHARE_WAIT: Duration = Duration::from_secs(10);

/// Whether running the same work again may succeed.
pub(crate) fn is_transient(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Storage(StorageError::Busy(_) | StorageError::Unavailable(_))
    )
}

/// How long to wait before attempt `attempt + 1`: a growing cap (10 ms doubling to 640 ms)
/// and a random point in its upper half, so that writers who collided do not collide again.
pub fn backoff(attempt: u32) -> Duration {
    let cap = 10u64 << attempt.saturating_sub(1).min(6);
    Duration::from_millis(cap / 2 + random_below(cap / 2 + 1))
}

pub(crate) fn random_below(bound: u64) -> u64 {
    // A fresh `RandomState` is seeded from the system's randomness (WASI's on wasm32-wasip2).
    RandomState::new().build_hasher().finish() % bound.max(1)
}

/// Runs `attempt` again while it fails transiently, with [`backoff`], a bounded number of
/// times.
pub(crate) fn retry_transient<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut failures = TransientFailures::default();
    loop {
        match attempt() {
            Err(e) if failures.wait_to_retry(&e) => {}
            other => return other,
        }
    }
}

/// The transient failures of one piece of work so far.
#[derive(Debug, Default)]
pub(crate) struct TransientFailures(u32);

impl TransientFailures {
    /// After the work failed with `e`: whether to try it once more (`e` is transient and the
    /// bound not reached), having waited the [`backoff`] if so.
    pub(crate) fn wait_to_retry(&mut self, e: &StoreError) -> bool {
        if !is_transient(e) {
            return false;
        }
        self.0 += 1;
        let retry = may_retry_transient(e, self.0);
        if retry {
            std::thread::sleep(backoff(self.0));
        }
        retry
    }
}

/// Whether work that failed `attempts` times with `e` may be tried once more.
fn may_retry_transient(e: &StoreError, attempts: u32) -> bool {
    match e {
        StoreError::Storage(StorageError::Busy(_)) => attempts < BUSY_ATTEMPTS,
        StoreError::Storage(StorageError::Unavailable(_)) => attempts < UNAVAILABLE_ATTEMPTS,
        _ => false,
    }
}

/// How long to wait before planning again after attempt `attempt` found its facts moved: a
/// random point below a cap that starts at 1 ms and doubles to 32 ms ("full jitter"). A
/// conflict means another write on the same facts just committed, so there is no point in
/// waiting long; the randomness spreads the writers that collided.
pub fn conflict_backoff(attempt: u32) -> Duration {
    let cap_us = 1_000u64 << attempt.saturating_sub(1).min(5);
    Duration::from_micros(random_below(cap_us + 1))
}

/// How long a write with `ahead` of its org's writes waiting before it (when it last tried)
/// waits before it looks at the count again: 2 ms more for each, up to 50 ms, and a random
/// part as long again.
pub fn share_backoff(ahead: i64) -> Duration {
    let base_us = (2_000 * ahead.max(1) as u64).min(50_000);
    Duration::from_micros(base_us + random_below(base_us))
}
