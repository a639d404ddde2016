//! A node's GPU topology: its set of units and the generation that counts its changes.

use std::collections::BTreeSet;

use crate::Timestamp;
use crate::UnitId;
use crate::notice::vm_running_at;
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

/// The units a node update may not take away: those of `removed` still running a VM at
/// `now` (`running` holds each running VM's unit and deadline, by its row; a VM whose notice
/// ran out runs no more, though its row may still say so).
pub fn units_in_use(
    running: &[(UnitId, Option<Timestamp>)],
    removed: &BTreeSet<UnitId>,
    now: Timestamp,
) -> BTreeSet<UnitId> {
    running
        .iter()
        .filter(|(unit, deadline)| removed.contains(unit) && vm_running_at(*deadline, now))
        .map(|(unit, _)| unit.clone())
        .collect()
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
