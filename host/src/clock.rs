//! The guests' wall clock: the real clock plus an offset that tests can move.
//!
//! Components read the time through `wasi:clocks/wall-clock`. Every instance
//! of one host shares one [`ClockOffset`]; changing it takes effect for the
//! next clock read, so a test can jump a day ahead without sleeping. A test
//! may also stop the clock at an instant ([`ClockOffset::freeze_at`]) to look
//! at a boundary exactly (a VM's `terminatesAt` itself, the millisecond
//! before). The monotonic clock is left alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::TimeDelta;
use wasmtime_wasi::HostWallClock;

/// A shared, signed offset in nanoseconds, added to the real wall clock; or,
/// while frozen, the instant the clock stands at.
#[derive(Clone, Debug)]
pub struct ClockOffset(Arc<AtomicI64>, Arc<AtomicI64>);

/// The frozen instant's value when the clock runs.
const RUNNING: i64 = i64::MIN;

impl Default for ClockOffset {
    fn default() -> Self {
        ClockOffset(Arc::default(), Arc::new(AtomicI64::new(RUNNING)))
    }
}

impl ClockOffset {
    /// Stops the clock at `nanos_since_epoch` until [`ClockOffset::set`] or
    /// [`ClockOffset::unfreeze`] lets it run again.
    pub fn freeze_at(&self, nanos_since_epoch: i64) {
        self.1.store(nanos_since_epoch.max(0), Ordering::Relaxed);
    }

    /// Lets a frozen clock run again (with the offset it had).
    pub fn unfreeze(&self) {
        self.1.store(RUNNING, Ordering::Relaxed);
    }

    pub fn new(offset: TimeDelta) -> Self {
        let this = Self::default();
        this.set(offset);
        this
    }

    /// Sets the offset (negative = the past). Saturates at about ±292 years.
    pub fn set(&self, offset: TimeDelta) {
        let nanos = offset
            .num_nanoseconds()
            .unwrap_or(if offset < TimeDelta::zero() {
                i64::MIN
            } else {
                i64::MAX
            });
        self.0.store(nanos, Ordering::Relaxed);
        self.unfreeze();
    }

    pub fn get(&self) -> TimeDelta {
        TimeDelta::nanoseconds(self.0.load(Ordering::Relaxed))
    }

    /// The guests' "now": real time plus the offset, clamped at the epoch.
    pub fn now(&self) -> SystemTime {
        let frozen = self.1.load(Ordering::Relaxed);
        if frozen != RUNNING {
            return UNIX_EPOCH + Duration::from_nanos(frozen as u64);
        }
        let nanos = self.0.load(Ordering::Relaxed);
        let real = SystemTime::now();
        let shifted = if nanos >= 0 {
            real.checked_add(Duration::from_nanos(nanos as u64))
        } else {
            real.checked_sub(Duration::from_nanos(nanos.unsigned_abs()))
        };
        shifted.unwrap_or(UNIX_EPOCH).max(UNIX_EPOCH)
    }
}

/// A [`HostWallClock`] that reads [`ClockOffset::now`].
pub struct OffsetWallClock(pub ClockOffset);

impl HostWallClock for OffsetWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        self.0
            .now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real_now() -> Duration {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
    }

    /// The guests' clock read between two readings of the real one, moved by `offset`: no
    /// tolerance, so a slow machine cannot make it flake.
    fn assert_moved_by(clock: &OffsetWallClock, seconds: i64) {
        let shift = |d: Duration| d.as_nanos() as i128 + seconds as i128 * 1_000_000_000;
        let before = real_now();
        let now = clock.now().as_nanos() as i128;
        let after = real_now();
        assert!(
            shift(before) <= now && now <= shift(after),
            "{now} not within {}..={} ({seconds} s from the real clock)",
            shift(before),
            shift(after)
        );
    }

    #[test]
    fn a_frozen_clock_stands_still_until_it_runs_again() {
        let offset = ClockOffset::default();
        let clock = OffsetWallClock(offset.clone());
        offset.freeze_at(1_700_000_000_123_000_000);
        assert_eq!(clock.now(), Duration::from_nanos(1_700_000_000_123_000_000));
        assert_eq!(clock.now(), Duration::from_nanos(1_700_000_000_123_000_000));
        offset.set(TimeDelta::days(1));
        assert_moved_by(&clock, 86_400);
        offset.freeze_at(5);
        offset.unfreeze();
        assert_moved_by(&clock, 86_400);
    }

    #[test]
    fn offset_moves_the_clock_both_ways() {
        let offset = ClockOffset::default();
        let clock = OffsetWallClock(offset.clone());
        assert_moved_by(&clock, 0);

        offset.set(TimeDelta::days(1));
        assert_moved_by(&clock, 86_400);
        assert_eq!(offset.get(), TimeDelta::days(1));

        offset.set(TimeDelta::hours(-2));
        assert_moved_by(&clock, -7_200);
    }

    #[test]
    fn clamps_at_the_epoch() {
        let offset = ClockOffset::new(TimeDelta::days(-365 * 200));
        assert_eq!(OffsetWallClock(offset).now(), Duration::ZERO);
    }
}
