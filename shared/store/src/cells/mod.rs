//! Cells: the market partitioned over several databases, each with its own write lock
//! (docs/design.md, "Cells").
//!
//! A node, with everything about it (its units, reservations, VMs, audit chain, the
//! idempotency records of requests about it), lives in one of the deployment's cells. Which
//! one is decided by its id alone, by rendezvous hashing over the cells' labels: every cell
//! scores the id (SHA-256 of the label and the id) and the highest score wins. So nothing is
//! looked up to find a node, every replica agrees, and adding a cell moves only the nodes
//! the new cell now wins (about one in S+1), none between the cells that were there.
//!
//! Cell 0 is Spin's `default` database, which also holds the directory: orgs, API keys and
//! operator keys, and the platform's audit chain. With one cell the whole market is that
//! database, as an app with no runtime config has it.

mod positions;
mod stores;

use sha2::{Digest, Sha256};

pub use positions::Positions;
pub use stores::{CellStores, FeedHeads, TrailPage};

/// The label of the database that holds the directory, and cell 0.
pub const DIRECTORY_LABEL: &str = "default";

/// One of the deployment's cells: a Spin SQLite database label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cell(usize);

impl Cell {
    /// The cell whose database also holds the directory.
    pub const DIRECTORY: Cell = Cell(0);

    /// Its place among the cells, from 0.
    pub fn index(self) -> usize {
        self.0
    }

    /// Its Spin SQLite database label: `default` for cell 0, `cell<n>` for the others (each
    /// word of a Spin label starts with a letter, so not `cell-<n>`).
    pub fn label(self) -> String {
        match self.0 {
            0 => DIRECTORY_LABEL.to_owned(),
            n => format!("cell{n}"),
        }
    }
}

/// How many cells the market is partitioned over: at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cells(usize);

impl Cells {
    /// The largest deployment this build names labels for.
    pub const MAX: usize = 64;

    /// One database for everything.
    pub const ONE: Cells = Cells(1);

    /// `count` cells, if it is from 1 to [`Cells::MAX`].
    pub fn new(count: usize) -> Option<Cells> {
        (1..=Cells::MAX).contains(&count).then_some(Cells(count))
    }

    pub fn count(self) -> usize {
        self.0
    }

    /// Every cell, the directory's first.
    pub fn all(self) -> impl Iterator<Item = Cell> {
        (0..self.0).map(Cell)
    }

    /// The cell at `index`, if there is one.
    pub fn cell(self, index: usize) -> Option<Cell> {
        (index < self.0).then_some(Cell(index))
    }

    /// The cell that holds what `id` names (a node, or a VM placed to sit with its node).
    pub fn home_of(self, id: &str) -> Cell {
        self.all()
            .max_by_key(|cell| (score(*cell, id), std::cmp::Reverse(cell.0)))
            .unwrap_or(Cell::DIRECTORY)
    }
}

/// A cell's score for an id: the first eight bytes of SHA-256 over its label and the id.
fn score(cell: Cell, id: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(cell.label().as_bytes())
        .chain_update([0])
        .chain_update(id.as_bytes())
        .finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 is 32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> impl Iterator<Item = String> {
        (0..4_000).map(|n| format!("node-{n}"))
    }

    #[test]
    fn one_cell_holds_everything_in_the_default_database() {
        assert_eq!(Cells::ONE.home_of("node-1"), Cell::DIRECTORY);
        assert_eq!(Cell::DIRECTORY.label(), "default");
        assert_eq!(Cells::new(3).unwrap().cell(2).unwrap().label(), "cell2");
        assert_eq!(Cells::new(0), None);
        assert_eq!(Cells::new(Cells::MAX + 1), None);
    }

    #[test]
    fn nodes_spread_over_the_cells() {
        let cells = Cells::new(4).unwrap();
        let mut counts = [0; 4];
        for id in ids() {
            counts[cells.home_of(&id).index()] += 1;
        }
        for count in counts {
            assert!((800..1_200).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn adding_a_cell_moves_only_what_the_new_cell_wins() {
        let before = Cells::new(4).unwrap();
        let after = Cells::new(5).unwrap();
        let mut moved = 0;
        for id in ids() {
            let (was, is) = (before.home_of(&id), after.home_of(&id));
            if was != is {
                assert_eq!(is.index(), 4, "{id} moved between cells that were there");
                moved += 1;
            }
        }
        assert!((600..1_000).contains(&moved), "{moved} of 4000 moved");
    }
}
