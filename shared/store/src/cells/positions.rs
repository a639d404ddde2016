//! Positions across cells: how far a reader has come in each cell's audit trail. Every write
//! appends an event, so a cell's newest event's `seq` says how far a copy of that cell has
//! come; across cells a position is one such number per cell. The audit listing's cursor,
//! the events feed's `after` and `nextCursor`, and a `Bookmark` are all positions.
//!
//! As text: `p` and each cell's position in decimal, cell 0's first, joined by dots
//! (`p1234` with one cell, `p1234.0.56.7` with four). Clients treat it as opaque. A position
//! with fewer numbers than the deployment has cells (written before a cell was added) reads
//! as 0 in the cells it does not name.

use super::{Cell, Cells};

/// The most digits of one cell's position: a `seq` fits in 18.
const MAX_DIGITS: usize = 18;

/// One position per cell, cell 0's first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Positions(Vec<i64>);

impl Positions {
    /// The start of every cell's trail.
    pub fn start(cells: Cells) -> Positions {
        Positions(vec![0; cells.count()])
    }

    /// The position in `cell`.
    pub fn get(&self, cell: Cell) -> i64 {
        self.0.get(cell.index()).copied().unwrap_or(0)
    }

    /// Moves the position in `cell` up to `position`, never back.
    pub fn advance(&mut self, cell: Cell, position: i64) {
        if let Some(at) = self.0.get_mut(cell.index()) {
            *at = (*at).max(position);
        }
    }

    /// Each cell's position the greater of this one's and `other`'s.
    pub fn join(&mut self, other: &Positions) {
        for (at, theirs) in self.0.iter_mut().zip(&other.0) {
            *at = (*at).max(*theirs);
        }
    }

    /// Whether every cell's position is at least `other`'s.
    pub fn covers(&self, other: &Positions) -> bool {
        self.0.iter().zip(&other.0).all(|(at, theirs)| at >= theirs)
    }

    /// The cells and positions of the cells past their start.
    pub fn past_start(&self) -> impl Iterator<Item = (Cell, i64)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, at)| **at > 0)
            .map(|(index, at)| (Cell(index), *at))
    }

    /// The text a client is given (see the module's comment).
    pub fn format(&self) -> String {
        let numbers: Vec<String> = self.0.iter().map(i64::to_string).collect();
        format!("p{}", numbers.join("."))
    }

    /// The position `text` names in a deployment of `cells`; `None` if it is not one this
    /// API gives (more numbers than cells, a sign, a leading zero, too many digits).
    pub fn parse(text: &str, cells: Cells) -> Option<Positions> {
        let numbers: Vec<&str> = text.strip_prefix('p')?.split('.').collect();
        if numbers.len() > cells.count() {
            return None;
        }
        let mut positions = Positions::start(cells);
        for (at, number) in positions.0.iter_mut().zip(numbers) {
            *at = Positions::parse_one(number)?;
        }
        Some(positions)
    }

    /// One cell's position as this API writes it: decimal digits, no sign, no leading zero,
    /// at most 18 of them; `None` for anything else.
    pub fn parse_one(number: &str) -> Option<i64> {
        let digits_only = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
        let canonical = number == "0" || !number.starts_with('0');
        if !digits_only || !canonical || number.len() > MAX_DIGITS {
            return None;
        }
        number.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(count: usize) -> Cells {
        Cells::new(count).unwrap()
    }

    #[test]
    fn a_position_is_one_number_per_cell_after_a_p() {
        let mut at = Positions::start(cells(4));
        assert_eq!(at.format(), "p0.0.0.0");
        at.advance(Cell(2), 56);
        at.advance(Cell(2), 7);
        at.advance(Cell(0), 1234);
        assert_eq!(at.format(), "p1234.0.56.0");
        assert_eq!(Positions::parse("p1234.0.56.0", cells(4)), Some(at.clone()));
        assert_eq!(
            Positions::parse("p1234", cells(1)).unwrap().get(Cell(0)),
            1234
        );
        // Written before cells 2 and 3 were added: they start at 0.
        let older = Positions::parse("p1234.9", cells(4)).unwrap();
        assert_eq!(older.format(), "p1234.9.0.0");
        assert!(!at.covers(&older) && !older.covers(&at));
        let mut both = at.clone();
        both.join(&older);
        assert!(both.covers(&at) && both.covers(&older));
        assert_eq!(
            both.past_start().collect::<Vec<_>>(),
            [(Cell(0), 1234), (Cell(1), 9), (Cell(2), 56)]
        );
    }

    #[test]
    fn only_positions_this_api_gives_are_read() {
        for junk in [
            "",
            "p",
            "1234",
            "p-1",
            "p+1",
            "p01",
            "p1..2",
            "p1.2.",
            "p1.2.3.4.5",
            "p 1",
            "P1",
            "p1234567890123456789",
            "p1e3",
        ] {
            assert_eq!(Positions::parse(junk, cells(4)), None, "{junk:?}");
        }
    }
}
