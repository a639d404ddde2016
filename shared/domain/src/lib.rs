//! The rules of the GPU reservations market (see docs/design.md), as plain functions over plain
//! data. No Spin, no I/O: components parse, call these, persist and render.

pub mod access;
pub mod audit;
pub mod capacity;
pub mod error;
pub mod ids;
pub mod market;
pub mod notice;
pub mod placement;
pub mod reservation;
pub mod status;
pub mod time;
pub mod topology;
pub mod unit_refusal;
pub mod values;
pub mod vm;

pub use error::{DomainError, Refusal};

pub type OrgId = String;
pub type NodeId = String;
pub type UnitId = String;
pub type ReservationId = String;
pub type VmId = String;
pub type Timestamp = time::Timestamp;
