//! The ways a domain rule can refuse a request. Each has a stable `code` and a [`Refusal`]
//! kind (hidden, forbidden, invalid input, conflict with the current state), so every
//! component answers the same refusal the same way.

use std::borrow::Cow;

use crate::status::Status;
use crate::unit_refusal::UnitRefusal;
use crate::{OrgId, ReservationId, UnitId, VmId};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DomainError {
    /// The object does not exist, or the caller may not learn that it does.
    #[error("{what} not found")]
    NotFound { what: &'static str },
    #[error("{0}")]
    Forbidden(Cow<'static, str>),
    /// Well-formed input that breaks a rule about one field.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: Cow<'static, str>,
    },
    #[error("{field} repeats ids: {}", ids.join(", "))]
    DuplicateIds {
        field: &'static str,
        ids: Vec<String>,
    },
    /// Units named that are not part of the reservation (or of the node).
    #[error("units not in the reservation: {}", unit_ids.join(", "))]
    NotInReservation { unit_ids: Vec<UnitId> },
    #[error("units not on the node: {}", unit_ids.join(", "))]
    UnknownUnits { unit_ids: Vec<UnitId> },
    #[error("unknown orgs: {}", org_ids.join(", "))]
    UnknownOrgs { org_ids: Vec<OrgId> },
    /// The reservation is not in a status that allows the operation.
    #[error("the reservation is {}", status.as_str())]
    NotActive { status: Status },
    #[error("the reservation is {}, not needs-review", status.as_str())]
    NotNeedsReview { status: Status },
    #[error("the reservation is already {}", status.as_str())]
    AlreadyFinal { status: Status },
    /// Units already reserved by another reservation for an overlapping term.
    #[error("units already reserved for an overlapping term: {}", unit_ids.join(", "))]
    ReservationOverlap {
        unit_ids: Vec<UnitId>,
        reservation_ids: Vec<ReservationId>,
    },
    /// Units that cannot be released because a non-spot VM is running on them.
    #[error("units run non-spot VMs and are not idle: {}", unit_ids.join(", "))]
    UnitsNotIdle {
        unit_ids: Vec<UnitId>,
        vm_ids: Vec<VmId>,
    },
    /// Units that cannot be removed from a node because VMs are running on them.
    #[error("units run VMs: {}", unit_ids.join(", "))]
    UnitsInUse { unit_ids: Vec<UnitId> },
    #[error("the VM cannot be placed on {} unit(s)", refusals.len())]
    PlacementRefused { refusals: Vec<UnitRefusal> },
    #[error("the VM is already terminated")]
    VmAlreadyTerminated,
    /// An id chosen by the caller that is already taken.
    #[error("{what} {id} already exists")]
    AlreadyExists { what: &'static str, id: String },
    /// The org holds as many live API keys as one org may.
    #[error("the org already holds {limit} live API keys; revoke one first")]
    TooManyKeys { limit: usize },
}

impl DomainError {
    pub fn invalid(field: &'static str, message: impl Into<Cow<'static, str>>) -> DomainError {
        DomainError::Invalid {
            field,
            message: message.into(),
        }
    }

    /// The stable, machine-readable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            DomainError::NotFound { .. } => "not-found",
            DomainError::Forbidden(_) => "forbidden",
            DomainError::Invalid { .. } => "invalid-field",
            DomainError::DuplicateIds { .. } => "duplicate-ids",
            DomainError::NotInReservation { .. } => "units-not-in-reservation",
            DomainError::UnknownUnits { .. } => "unknown-units",
            DomainError::UnknownOrgs { .. } => "unknown-orgs",
            DomainError::NotActive { .. } => "reservation-not-active",
            DomainError::NotNeedsReview { .. } => "reservation-not-needs-review",
            DomainError::AlreadyFinal { .. } => "reservation-final",
            DomainError::ReservationOverlap { .. } => "reservation-overlap",
            DomainError::UnitsNotIdle { .. } => "units-not-idle",
            DomainError::UnitsInUse { .. } => "units-in-use",
            DomainError::PlacementRefused { .. } => "placement-refused",
            DomainError::VmAlreadyTerminated => "vm-terminated",
            DomainError::AlreadyExists { .. } => "already-exists",
            DomainError::TooManyKeys { .. } => "too-many-keys",
        }
    }

    /// What kind of refusal this is.
    pub fn refusal(&self) -> Refusal {
        match self {
            DomainError::NotFound { .. } => Refusal::Hidden,
            DomainError::Forbidden(_) => Refusal::Forbidden,
            DomainError::Invalid { .. }
            | DomainError::DuplicateIds { .. }
            | DomainError::NotInReservation { .. }
            | DomainError::UnknownUnits { .. }
            | DomainError::UnknownOrgs { .. } => Refusal::InvalidInput,
            DomainError::NotActive { .. }
            | DomainError::NotNeedsReview { .. }
            | DomainError::AlreadyFinal { .. }
            | DomainError::ReservationOverlap { .. }
            | DomainError::UnitsNotIdle { .. }
            | DomainError::UnitsInUse { .. }
            | DomainError::PlacementRefused { .. }
            | DomainError::VmAlreadyTerminated
            | DomainError::AlreadyExists { .. }
            | DomainError::TooManyKeys { .. } => Refusal::Conflict,
        }
    }
}

/// The kinds of refusal, as the API's problem codes name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The object does not exist, or the caller may not learn that it does.
    Hidden,
    /// The caller may see the object but not do this to it.
    Forbidden,
    /// Well-formed input that breaks a rule.
    InvalidInput,
    /// The request conflicts with the current state (not active, unit busy, taken id).
    Conflict,
}
