//! Positions in the audit trail of every cell, as the feed's cursors and bookmarks give them
//! (`reservations_store::cells::Positions`): what a suite compares them by, and one beyond
//! every event there will be.

use reservations_store::cells::{Cells, Positions};

/// How many cells the app under test partitions its market over: `TEST_CELLS` (default 1).
pub fn cells_under_test() -> usize {
    std::env::var("TEST_CELLS")
        .ok()
        .and_then(|cells| cells.parse().ok())
        .filter(|cells| Cells::new(*cells).is_some())
        .unwrap_or(1)
}

fn parse(text: &str) -> Positions {
    Positions::parse(text, Cells::new(Cells::MAX).expect("the most cells"))
        .unwrap_or_else(|| panic!("{text:?} is not a position"))
}

/// Whether the position `a` is behind `b` in some cell.
pub fn is_behind(a: &str, b: &str) -> bool {
    !parse(a).covers(&parse(b))
}

/// A position beyond every event a test will write, in every cell under test: a feed
/// resumed from it waits.
pub fn beyond_every_event() -> String {
    format!("p{}", vec!["1000000000"; cells_under_test()].join("."))
}

/// `bookmark` moved ahead by `by` in every cell: a bookmark this API never answered.
pub fn ahead_of(bookmark: &str, by: i64) -> String {
    let numbers: Vec<String> = bookmark
        .strip_prefix('p')
        .expect("a position")
        .split('.')
        .map(|n| (n.parse::<i64>().expect("a number") + by).to_string())
        .collect();
    format!("p{}", numbers.join("."))
}
