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

/// `bookmark` moved ahead by `by` in every cell, each cell keeping the tag it had (a cell
/// at its start given a made-up one): a bookmark this API never answered.
pub fn ahead_of(bookmark: &str, by: i64) -> String {
    let parts: Vec<String> = bookmark
        .strip_prefix('p')
        .expect("a bookmark")
        .split('.')
        .map(|part| {
            let (number, tag) = part.split_once('-').unwrap_or((part, "0123456789abcdef"));
            format!("{}-{tag}", number.parse::<i64>().expect("a number") + by)
        })
        .collect();
    format!("p{}", parts.join("."))
}

/// The position a bookmark names in each cell, without its tags (`p` and dotted numbers).
pub fn of_bookmark(bookmark: &str) -> String {
    let numbers: Vec<&str> = bookmark
        .strip_prefix('p')
        .expect("a bookmark")
        .split('.')
        .map(|part| part.split('-').next().expect("a number"))
        .collect();
    format!("p{}", numbers.join("."))
}
