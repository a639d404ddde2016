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
//!
//! Below: a reader's [`Positions`], one per cell; the stores of a request, one per cell
//! ([`CellStores`]); and what spans cells, the merges of each cell's page into one
//! ([`merged`], [`merged_trail`], [`merged_verifications`]).

use crate::audit::{ChainVerification, Listed};
use crate::keys::{ApiKey, OperatorKey};
use crate::nodes::ListedNode;
use crate::write::NODE_CHAIN_PREFIX;
use crate::{Context, Page, Store, UnreadableRow};
use reservations_domain::market::{Offer, cursor_of, parse_cursor};
use reservations_domain::vm::Vm;
use sha2::{Digest, Sha256};

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

// ============================================================================================
// Positions, one per cell
//
// Positions across cells: how far a reader has come in each cell's audit trail. Every write
// appends an event, so a cell's newest event's `seq` says how far a copy of that cell has
// come; across cells a position is one such number per cell. The audit listing's cursor,
// the events feed's `after` and `nextCursor`, and a `Bookmark` are all positions.
//
// As text: `p` and each cell's position in decimal, cell 0's first, joined by dots
// (`p1234` with one cell, `p1234.0.56.7` with four). Clients treat it as opaque. A position
// with fewer numbers than the deployment has cells (written before a cell was added) reads
// as 0 in the cells it does not name.

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

// ============================================================================================
// The stores of every cell
//
// The stores of a request, one per cell, and what spans cells: the pages each cell gave,
// merged into one (docs/design.md, "Cells").

/// The stores of a request, one per cell: a request about one node sends statements to its
/// cell only (and the directory, for the caller's key). What spans cells reads each and
/// merges (with [`merged`] and its kin). A store sends nothing until it is asked something, so having
/// one for every cell costs nothing.
pub struct CellStores<'a> {
    cells: Cells,
    directory: &'a Store<'a>,
    /// The stores of cells 1 … S-1.
    others: Vec<Store<'a>>,
}

impl<'a> CellStores<'a> {
    /// The cells of a deployment: `directory` is cell 0's store, `others` those of cells 1 …
    /// S-1, in order.
    pub fn new(cells: Cells, directory: &'a Store<'a>, others: Vec<Store<'a>>) -> CellStores<'a> {
        assert_eq!(others.len() + 1, cells.count(), "a store for every cell");
        CellStores {
            cells,
            directory,
            others,
        }
    }

    pub fn cells(&self) -> Cells {
        self.cells
    }

    /// The store of the directory (orgs, keys), which is also cell 0's.
    pub fn directory(&self) -> &'a Store<'a> {
        self.directory
    }

    /// The store of `cell`.
    pub fn store(&self, cell: Cell) -> &Store<'a> {
        match cell.index() {
            0 => self.directory,
            n => &self.others[n - 1],
        }
    }

    /// The store of the cell that holds `node_id`.
    pub fn of_node(&self, node_id: &str) -> &Store<'a> {
        self.store(self.cells.home_of(node_id))
    }

    /// Every cell's store, with its cell.
    pub fn all(&self) -> impl Iterator<Item = (Cell, &Store<'a>)> {
        self.cells
            .all()
            .zip(std::iter::once(self.directory).chain(&self.others))
    }

    /// The cells a request about `node_id` reads: the node's, or, about no node, every cell.
    pub fn cells_of(&self, node_id: Option<&str>) -> Vec<Cell> {
        match node_id {
            Some(node) => vec![self.cells.home_of(node)],
            None => self.cells.all().collect(),
        }
    }

    /// The cell that holds the chain `chain`: a node's chain is its node's cell's, the
    /// platform's and earlier builds' are the directory's.
    pub fn cell_of_chain(&self, chain: &str) -> Cell {
        match chain.strip_prefix(NODE_CHAIN_PREFIX) {
            Some(node) => self.cells.home_of(node),
            None => Cell::DIRECTORY,
        }
    }

    /// Where the VM `id` is looked for, in order: the cell its id names (where it was
    /// placed), then the others, where a node moved since took it.
    pub fn cells_for_vm(&self, id: &str) -> impl Iterator<Item = Cell> + use<'_> {
        let named = self.cells.home_of(id);
        std::iter::once(named).chain(self.cells.all().filter(move |cell| *cell != named))
    }
}

impl<'a> CellStores<'a> {
    /// Revokes a key of an org. With more than one cell, every other cell is told first,
    /// once the directory says the caller may revoke it, so that no cell's write statement
    /// takes the key once the revocation is answered; a cell that cannot be told fails the
    /// request before the directory records it, and the request may be sent again.
    pub fn revoke_key(
        &self,
        ctx: &Context<'_>,
        org_id: &str,
        key_id: &str,
    ) -> crate::Result<ApiKey> {
        self.tell_every_cell(ctx, Some(org_id), key_id)?;
        self.directory.identity().revoke_key(ctx, org_id, key_id)
    }

    /// Revokes an operator key, every other cell told first (see [`CellStores::revoke_key`]).
    pub fn revoke_operator_key(
        &self,
        ctx: &Context<'_>,
        key_id: &str,
    ) -> crate::Result<OperatorKey> {
        self.tell_every_cell(ctx, None, key_id)?;
        self.directory.identity().revoke_operator_key(ctx, key_id)
    }

    /// Tells every cell but the directory that the key `key_id` (of the org `org_id`, or an
    /// operator key) is revoked, once the directory says the caller may revoke it: before
    /// the directory's write records the revocation.
    pub fn tell_every_cell(
        &self,
        ctx: &Context<'_>,
        org_id: Option<&str>,
        key_id: &str,
    ) -> crate::Result<()> {
        if self.cells.count() == 1 {
            return Ok(());
        }
        self.directory
            .identity()
            .check_revocation(ctx, org_id, key_id)?;
        for cell in self.cells.all().skip(1) {
            self.store(cell)
                .identity()
                .hold_revocation(key_id, ctx.now)?;
        }
        Ok(())
    }
}

/// A stretch of the audit trail across cells: the rows of a page in the order they are
/// shown (each with its cell), where the reader stands after them, and whether any cell
/// has more.
#[derive(Debug, Clone, PartialEq)]
pub struct TrailPage {
    pub rows: Vec<(Cell, Listed)>,
    pub next: Positions,
    pub more: bool,
}

/// A page of the trail from each cell's page (each read after the cell's position in
/// `after`, at most `limit` rows, in the cell's order): the rows merged by the time they
/// record (earliest first, a cell's rows never reordered), the first `limit` kept; the
/// reader's position moves in each cell to the last row kept from it.
pub fn merged_trail(
    pages: Vec<(Cell, Page<Listed>)>,
    after: &Positions,
    limit: usize,
) -> TrailPage {
    let limit = limit.clamp(1, crate::audit::MAX_AUDIT_PAGE);
    let mut streams: Vec<_> = pages
        .into_iter()
        .map(|(cell, page)| {
            let more = page.next_cursor.is_some();
            (cell, page.items.into_iter().peekable(), more)
        })
        .collect();
    let mut next = after.clone();
    let mut rows = Vec::new();
    while rows.len() < limit {
        let earliest = streams
            .iter_mut()
            .filter_map(|(cell, items, _)| items.peek().map(|row| (trail_key(row), *cell)))
            .min();
        let Some((_, cell)) = earliest else { break };
        let (_, items, _) = streams
            .iter_mut()
            .find(|(c, ..)| *c == cell)
            .expect("the stream just peeked");
        let row = items.next().expect("the row just peeked");
        next.advance(cell, row.seq());
        rows.push((cell, row));
    }
    let more = streams
        .iter_mut()
        .any(|(_, items, more)| *more || items.peek().is_some());
    TrailPage { rows, next, more }
}

/// Where a row of the trail falls in a merged page: an event by the time it records; a row
/// that cannot be read first (its cell's order keeps it after the events before it).
fn trail_key(row: &Listed) -> i64 {
    match row {
        Listed::Event(event) => event.at.timestamp_millis(),
        Listed::Unreadable { .. } => i64::MIN,
    }
}

/// The verifications of each cell's chains as one: the first broken chain (by name) named,
/// every chain listed by name.
pub fn merged_verifications(verifications: Vec<ChainVerification>) -> ChainVerification {
    let mut merged = ChainVerification {
        ok: verifications.iter().all(|v| v.ok),
        events_checked: verifications.iter().map(|v| v.events_checked).sum(),
        broken_chain: None,
        first_broken_seq: None,
        problem: None,
        chains: Vec::new(),
    };
    let first_broken = verifications
        .iter()
        .filter(|v| !v.ok)
        .min_by(|a, b| a.broken_chain.cmp(&b.broken_chain));
    if let Some(broken) = first_broken {
        merged.broken_chain = broken.broken_chain.clone();
        merged.first_broken_seq = broken.first_broken_seq;
        merged.problem = broken.problem.clone();
    }
    merged.chains = verifications.into_iter().flat_map(|v| v.chains).collect();
    merged.chains.sort_by(|a, b| a.chain.cmp(&b.chain));
    merged
}

/// A row of a listing that every cell orders the same way: where it falls, and the cursor
/// that resumes after it.
pub trait Ordered {
    type Key: Ord;
    /// The most rows a page of the listing holds.
    const MAX_PAGE: usize;
    fn key(&self) -> Self::Key;
    /// Where a row that could not be read falls, by the key it is named by.
    fn unreadable_key(key: &str) -> Self::Key;
    fn cursor(&self) -> String;
}

impl Ordered for ListedNode {
    type Key = String;
    const MAX_PAGE: usize = crate::nodes::MAX_NODE_PAGE;
    fn key(&self) -> String {
        self.summary.id.clone()
    }
    fn unreadable_key(key: &str) -> String {
        key.to_owned()
    }
    fn cursor(&self) -> String {
        self.summary.id.clone()
    }
}

impl Ordered for Vm {
    type Key = String;
    const MAX_PAGE: usize = crate::vms::MAX_VM_PAGE;
    fn key(&self) -> String {
        self.id.clone()
    }
    fn unreadable_key(key: &str) -> String {
        key.to_owned()
    }
    fn cursor(&self) -> String {
        self.id.clone()
    }
}

impl Ordered for Offer {
    type Key = (String, String);
    const MAX_PAGE: usize = reservations_domain::market::MAX_PAGE;
    fn key(&self) -> (String, String) {
        (self.node_id.clone(), self.unit_id.clone())
    }
    fn unreadable_key(key: &str) -> (String, String) {
        let (node, unit) = parse_cursor(key).unwrap_or((key, ""));
        (node.to_owned(), unit.to_owned())
    }
    fn cursor(&self) -> String {
        cursor_of(&self.node_id, &self.unit_id)
    }
}

/// One page of a listing that every cell orders the same way, from the pages each cell gave
/// from the same cursor (each at most `limit` rows, in order): the first `limit` rows of
/// them all, and a next cursor if any cell had more. A cell's rows past the page's last are
/// read again from its cursor, so nothing is skipped or listed twice.
pub fn merged<T: Ordered>(pages: Vec<Page<T>>, limit: usize) -> Page<T> {
    let limit = limit.clamp(1, T::MAX_PAGE);
    let more = pages.iter().any(|page| page.next_cursor.is_some());
    let mut rows: Vec<(T::Key, std::result::Result<T, UnreadableRow>)> = Vec::new();
    for page in pages {
        rows.extend(page.items.into_iter().map(|item| (item.key(), Ok(item))));
        rows.extend(
            page.unreadable
                .into_iter()
                .map(|row| (T::unreadable_key(&row.key), Err(row))),
        );
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let more = more || rows.len() > limit;
    rows.truncate(limit);
    let next_cursor = match rows.last() {
        Some((_, Ok(item))) if more => Some(item.cursor()),
        Some((_, Err(row))) if more => Some(row.key.clone()),
        _ => None,
    };
    let mut page = Page::empty();
    page.next_cursor = next_cursor;
    for (_, row) in rows {
        match row {
            Ok(item) => page.items.push(item),
            Err(row) => page.unreadable.push(row),
        }
    }
    page
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

#[cfg(test)]
mod positions_tests {
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
