//! A node's GPU topology: its set of units and the generation that counts its changes.

use std::collections::BTreeSet;

use crate::Timestamp;
use crate::UnitId;
use crate::reservation::{StoredState, Term};

/// The generation a node has after its unit set becomes `new_units`: one more whenever the
/// set changes (order and repeats do not count as a change), the same otherwise.
pub fn next_topology_gen(
    current_gen: i64,
    old_units: &BTreeSet<UnitId>,
    new_units: &BTreeSet<UnitId>,
) -> i64 {
    if old_units == new_units {
        current_gen
    } else {
        current_gen + 1
    }
}

/// Whether a reservation written against `reservation_gen` must be withheld for review once
/// its node is at `node_gen`: every reservation that is neither cancelled nor expired and was
/// written against an older generation.
pub fn needs_review(
    stored: StoredState,
    term: &Term,
    reservation_gen: i64,
    node_gen: i64,
    now: Timestamp,
) -> bool {
    stored == StoredState::Live && !term.has_ended(now) && reservation_gen < node_gen
}
