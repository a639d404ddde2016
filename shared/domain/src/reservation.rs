//! Reservations: a term on some units of one node, for an audience of orgs.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

pub use crate::status::Status;

use crate::error::DomainError;
use crate::{NodeId, OrgId, ReservationId, Timestamp, UnitId};

/// The largest number of unit ids a release, reclaim or dry run may name.
pub const MAX_UNITS_PER_REQUEST: usize = 1024;

/// The largest number of units a node (and so a reservation) may have.
pub const MAX_UNITS_PER_NODE: usize = 131_072;

/// What the store keeps of a reservation's lifecycle. Everything else is derived from the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoredState {
    /// Neither cancelled nor withheld: the status follows the clock.
    Live,
    Cancelled,
    NeedsReview,
}

impl StoredState {
    pub fn as_str(self) -> &'static str {
        match self {
            StoredState::Live => "live",
            StoredState::Cancelled => "cancelled",
            StoredState::NeedsReview => "needs-review",
        }
    }

    pub fn parse(s: &str) -> Option<StoredState> {
        [
            StoredState::Live,
            StoredState::Cancelled,
            StoredState::NeedsReview,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// A term: from `starts_at` (inclusive) to `ends_at` (exclusive), or open-ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    pub starts_at: Timestamp,
    pub ends_at: Option<Timestamp>,
}

impl Term {
    pub fn has_started(&self, now: Timestamp) -> bool {
        now >= self.starts_at
    }

    pub fn has_ended(&self, now: Timestamp) -> bool {
        self.ends_at.is_some_and(|end| now >= end)
    }

    pub fn contains(&self, now: Timestamp) -> bool {
        self.has_started(now) && !self.has_ended(now)
    }

    /// Two terms overlap when some instant lies inside both.
    pub fn overlaps(&self, other: &Term) -> bool {
        let starts_before_other_ends = other.ends_at.is_none_or(|end| self.starts_at < end);
        let other_starts_before_self_ends = self.ends_at.is_none_or(|end| other.starts_at < end);
        starts_before_other_ends && other_starts_before_self_ends
    }
}

/// `cancelled` and `needs-review` are stored; otherwise the clock decides:
/// `pending` before `startsAt`, `expired` at or after `endsAt`, else `active`.
pub fn derive_status(stored: StoredState, term: &Term, now: Timestamp) -> Status {
    match stored {
        StoredState::Cancelled => Status::Cancelled,
        StoredState::NeedsReview => Status::NeedsReview,
        StoredState::Live if !term.has_started(now) => Status::Pending,
        StoredState::Live if term.has_ended(now) => Status::Expired,
        StoredState::Live => Status::Active,
    }
}

/// A reservation as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub id: ReservationId,
    pub node_id: NodeId,
    pub reserved_unit_ids: Vec<UnitId>,
    pub allowed_org_ids: Vec<OrgId>,
    pub managing_org_ids: Vec<OrgId>,
    pub term: Term,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
    pub released_unit_ids: Vec<UnitId>,
    /// For released units whose release ends by itself: when each comes back.
    pub released_until: std::collections::BTreeMap<UnitId, Timestamp>,
    pub topology_gen: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub stored_state: StoredState,
}

impl Reservation {
    pub fn status(&self, now: Timestamp) -> Status {
        derive_status(self.stored_state, &self.term, now)
    }
}

/// A request to create a reservation, as a caller sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReservation {
    pub reserved_unit_ids: Vec<UnitId>,
    pub allowed_org_ids: Vec<OrgId>,
    pub managing_org_ids: Vec<OrgId>,
    pub term: Term,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
}

/// Another reservation on the same node, as far as overlap checking needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExistingClaim {
    pub reservation_id: ReservationId,
    pub unit_ids: Vec<UnitId>,
    pub term: Term,
    pub stored_state: StoredState,
}

/// The facts a new reservation is checked against.
pub struct ReservationContext<'a> {
    pub node_unit_ids: &'a BTreeSet<UnitId>,
    /// Which of the named org ids exist.
    pub known_org_ids: &'a BTreeSet<OrgId>,
    /// Non-cancelled reservations on the node that share at least one unit with the request.
    pub claims: &'a [ExistingClaim],
}

/// Checks a new (or re-affirmed) reservation: units exist on the node and are not reserved
/// twice for overlapping terms, the term is well-formed, orgs exist, and no list repeats an id.
pub fn validate_reservation(
    request: &NewReservation,
    context: &ReservationContext<'_>,
) -> Result<(), DomainError> {
    UnitIds::check(
        "reservedUnitIds",
        &request.reserved_unit_ids,
        MAX_UNITS_PER_NODE,
    )?;
    reject_duplicates("allowedOrgIds", &request.allowed_org_ids)?;
    reject_duplicates("managingOrgIds", &request.managing_org_ids)?;
    if let Some(end) = request.term.ends_at
        && end <= request.term.starts_at
    {
        return Err(DomainError::invalid(
            "endsAt",
            "endsAt must be later than startsAt",
        ));
    }
    let unknown_units: Vec<UnitId> = request
        .reserved_unit_ids
        .iter()
        .filter(|unit| !context.node_unit_ids.contains(*unit))
        .cloned()
        .collect();
    if !unknown_units.is_empty() {
        return Err(DomainError::UnknownUnits {
            unit_ids: unknown_units,
        });
    }
    let requested: BTreeSet<&UnitId> = request.reserved_unit_ids.iter().collect();
    let mut conflicting_units = BTreeSet::new();
    let mut conflicting_reservations = BTreeSet::new();
    for claim in context.claims {
        if claim.stored_state == StoredState::Cancelled || !claim.term.overlaps(&request.term) {
            continue;
        }
        for unit in claim.unit_ids.iter().filter(|u| requested.contains(u)) {
            conflicting_units.insert(unit.clone());
            conflicting_reservations.insert(claim.reservation_id.clone());
        }
    }
    if !conflicting_units.is_empty() {
        return Err(DomainError::ReservationOverlap {
            unit_ids: conflicting_units.into_iter().collect(),
            reservation_ids: conflicting_reservations.into_iter().collect(),
        });
    }
    // Org ids are checked last: a caller that may not learn whether an org exists is told
    // nothing about it by a request that fails for any other reason first.
    let unknown_orgs: Vec<OrgId> = request
        .allowed_org_ids
        .iter()
        .chain(&request.managing_org_ids)
        .filter(|org| !context.known_org_ids.contains(*org))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !unknown_orgs.is_empty() {
        return Err(DomainError::UnknownOrgs {
            org_ids: unknown_orgs,
        });
    }
    Ok(())
}

/// A list of unit ids that has passed its rule: non-empty, bounded, no id twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitIds<'a>(&'a [UnitId]);

impl<'a> UnitIds<'a> {
    /// `ids` as a list of at most `max` units; `field` names it in the refusal.
    pub fn check(field: &'static str, ids: &'a [UnitId], max: usize) -> Result<Self, DomainError> {
        validate_unit_list(field, ids, max)?;
        Ok(UnitIds(ids))
    }

    pub fn as_slice(self) -> &'a [UnitId] {
        self.0
    }
}

fn validate_unit_list(
    field: &'static str,
    unit_ids: &[UnitId],
    max: usize,
) -> Result<(), DomainError> {
    if unit_ids.is_empty() {
        return Err(DomainError::invalid(field, "must name at least one unit"));
    }
    if unit_ids.len() > max {
        return Err(DomainError::invalid(
            field,
            format!("may name at most {max} units"),
        ));
    }
    reject_duplicates(field, unit_ids)
}

/// A list of ids in which no id appears twice.
pub fn reject_duplicates(field: &'static str, ids: &[String]) -> Result<(), DomainError> {
    let mut seen = BTreeSet::new();
    let repeated: BTreeSet<String> = ids
        .iter()
        .filter(|id| !seen.insert(id.as_str()))
        .cloned()
        .collect();
    if repeated.is_empty() {
        Ok(())
    } else {
        Err(DomainError::DuplicateIds {
            field,
            ids: repeated.into_iter().collect(),
        })
    }
}
