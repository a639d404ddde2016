//! Notice for spot buyers: a reclaim may give the spot VMs on the reclaimed units
//! `noticeSeconds` before they stop, and a release may end by itself at `until`.
//!
//! Nothing runs in the background. A VM under notice keeps its row as running with a
//! deadline (`terminatesAt`); every read derives from the clock whether it is still running
//! ([`vm_running_at`]), exactly as a reservation's status is derived, and the next write that
//! touches it writes the termination down. A deadline only ever moves earlier
//! ([`shorten`]): a later reclaim may shorten a notice, never lengthen it.

use std::collections::BTreeMap;

use chrono::TimeDelta;
use serde::{Deserialize, Serialize};

use crate::error::DomainError;
use crate::reservation::Term;
use crate::vm::Tier;
use crate::{ReservationId, Timestamp, UnitId};

/// The longest notice a reclaim may give, in seconds.
pub const MAX_NOTICE_SECONDS: i64 = 3600;

/// Why a VM was given a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptionReason {
    /// A reclaim with `noticeSeconds` took its units back.
    Reclaimed,
    /// It sits on units released only `until` a time.
    ReleaseEnds,
}

impl InterruptionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            InterruptionReason::Reclaimed => "reclaimed",
            InterruptionReason::ReleaseEnds => "release-ends",
        }
    }

    pub fn parse(s: &str) -> Option<InterruptionReason> {
        [
            InterruptionReason::Reclaimed,
            InterruptionReason::ReleaseEnds,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == s)
    }
}

/// A VM's notice: why, since when, until when, and which reservation's units it gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    pub reason: InterruptionReason,
    pub noticed_at: Timestamp,
    pub terminates_at: Timestamp,
    pub reservation_id: ReservationId,
    pub unit_ids: Vec<UnitId>,
}

/// Whether a VM whose row says running, with this deadline, still runs at `now`: it stops
/// at `terminatesAt` itself.
pub fn vm_running_at(terminates_at: Option<Timestamp>, now: Timestamp) -> bool {
    terminates_at.is_none_or(|deadline| now < deadline)
}

/// The notice a VM gets when placed on `unit_ids` at `now`: a spot VM on units released only
/// until a time ends at the earliest of those ends, given back to the reservation that set
/// it (with its units among them); `release_ends` holds, per unit, that end and reservation.
/// Other tiers never sit on released units, and units released with no end give no notice.
pub fn placement_notice(
    tier: Tier,
    release_ends: &BTreeMap<UnitId, (Timestamp, ReservationId)>,
    unit_ids: &[UnitId],
    now: Timestamp,
) -> Option<Interruption> {
    if tier != Tier::Spot {
        return None;
    }
    let (terminates_at, reservation_id) = unit_ids
        .iter()
        .filter_map(|u| release_ends.get(u))
        .min()?
        .clone();
    Some(Interruption {
        reason: InterruptionReason::ReleaseEnds,
        noticed_at: now,
        terminates_at,
        unit_ids: unit_ids
            .iter()
            .filter(|u| {
                release_ends
                    .get(*u)
                    .is_some_and(|(_, r)| *r == reservation_id)
            })
            .cloned()
            .collect(),
        reservation_id,
    })
}

/// The deadline a VM ends up with when given `new` while it has `existing`: the earlier.
pub fn shorten(existing: Option<Timestamp>, new: Timestamp) -> Timestamp {
    existing.map_or(new, |old| old.min(new))
}

/// Checks `noticeSeconds` (absent = 0 = an immediate reclaim).
pub fn validate_notice(notice_seconds: Option<i64>) -> Result<i64, DomainError> {
    match notice_seconds {
        None => Ok(0),
        Some(s) if (0..=MAX_NOTICE_SECONDS).contains(&s) => Ok(s),
        Some(_) => Err(DomainError::invalid(
            "noticeSeconds",
            format!("noticeSeconds must be between 0 and {MAX_NOTICE_SECONDS}"),
        )),
    }
}

/// Checks a release's `until`: later than now and inside the reservation's term (the end of
/// the term itself is allowed).
pub fn validate_until(until: Timestamp, term: &Term, now: Timestamp) -> Result<(), DomainError> {
    if until <= now {
        return Err(DomainError::invalid("until", "until must be in the future"));
    }
    if until <= term.starts_at || term.ends_at.is_some_and(|end| until > end) {
        return Err(DomainError::invalid(
            "until",
            "until must lie inside the reservation's term",
        ));
    }
    Ok(())
}

/// A unit's released flag as the clock sees it: released, and its release not yet over.
pub fn released_at(released: bool, until: Option<Timestamp>, now: Timestamp) -> bool {
    released && until.is_none_or(|until| now < until)
}

/// The instant `seconds` after `now`.
pub fn after(now: Timestamp, seconds: i64) -> Timestamp {
    now + TimeDelta::seconds(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::from_millis;

    #[test]
    fn a_vm_stops_at_its_deadline_itself_not_a_millisecond_later() {
        let deadline = from_millis(10_000);
        assert!(vm_running_at(Some(deadline), from_millis(9_999)));
        assert!(!vm_running_at(Some(deadline), deadline));
        assert!(!vm_running_at(Some(deadline), from_millis(10_001)));
        assert!(vm_running_at(None, from_millis(9_000_000_000_000)));
    }

    #[test]
    fn deadlines_only_move_earlier() {
        let (early, late) = (from_millis(1_000), from_millis(2_000));
        assert_eq!(shorten(None, late), late);
        assert_eq!(shorten(Some(early), late), early);
        assert_eq!(shorten(Some(late), early), early);
    }

    #[test]
    fn a_timed_release_ends_at_until_itself() {
        let until = from_millis(5_000);
        assert!(released_at(true, Some(until), from_millis(4_999)));
        assert!(!released_at(true, Some(until), until));
        assert!(released_at(true, None, until));
        assert!(!released_at(false, None, until));
    }

    #[test]
    fn notice_and_until_are_bounded() {
        assert_eq!(validate_notice(None), Ok(0));
        assert_eq!(validate_notice(Some(0)), Ok(0));
        assert_eq!(
            validate_notice(Some(MAX_NOTICE_SECONDS)),
            Ok(MAX_NOTICE_SECONDS)
        );
        for bad in [-1, MAX_NOTICE_SECONDS + 1] {
            assert_eq!(
                validate_notice(Some(bad)).unwrap_err().code(),
                "invalid-field"
            );
        }
        let now = from_millis(1_000);
        let term = Term {
            starts_at: from_millis(0),
            ends_at: Some(from_millis(9_000)),
        };
        assert!(
            validate_until(from_millis(9_000), &term, now).is_ok(),
            "the term's end"
        );
        assert!(validate_until(from_millis(1_001), &term, now).is_ok());
        for bad in [now, from_millis(999), from_millis(9_001)] {
            assert!(validate_until(bad, &term, now).is_err(), "{bad}");
        }
        let open = Term {
            starts_at: from_millis(0),
            ends_at: None,
        };
        assert!(validate_until(from_millis(9_000_000_000_000), &open, now).is_ok());
    }
}
