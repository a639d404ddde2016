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

use std::cell::OnceCell;

use reservations_domain::DomainError;
use reservations_domain::market::{Offer, cursor_of, parse_cursor};
use reservations_domain::vm::Vm;
use sha2::{Digest, Sha256};

use crate::keys::{ApiKey, OperatorKey};
use crate::nodes::ListedNode;
use crate::vms::VmFilter;
use crate::write::WriteContext;
use crate::{Context, Page, Store, StoreError, UnreadableRow};

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

    /// Its Spin SQLite database label: `default` for cell 0, `cell-<n>` for the others.
    pub fn label(self) -> String {
        match self.0 {
            0 => DIRECTORY_LABEL.to_owned(),
            n => format!("cell-{n}"),
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

/// The stores of a request, one per cell, each opened when first asked for: a request about
/// one node opens its cell only (and the directory, for the caller's key). What spans cells
/// reads each and merges (the listings below).
pub struct CellStores<'a> {
    cells: Cells,
    directory: &'a Store<'a>,
    open: Box<dyn Fn(Cell) -> crate::Result<Store<'a>> + 'a>,
    opened: Vec<OnceCell<Store<'a>>>,
}

impl<'a> CellStores<'a> {
    /// The cells of a deployment: `directory` is cell 0's store, `open` opens any other.
    pub fn new(
        cells: Cells,
        directory: &'a Store<'a>,
        open: impl Fn(Cell) -> crate::Result<Store<'a>> + 'a,
    ) -> CellStores<'a> {
        CellStores {
            cells,
            directory,
            open: Box::new(open),
            opened: (0..cells.count()).map(|_| OnceCell::new()).collect(),
        }
    }

    pub fn cells(&self) -> Cells {
        self.cells
    }

    /// The store of the directory (orgs, keys), which is also cell 0's.
    pub fn directory(&self) -> &'a Store<'a> {
        self.directory
    }

    /// The store of `cell`, opened now if this request has not yet.
    pub fn store(&self, cell: Cell) -> crate::Result<&Store<'a>> {
        if cell == Cell::DIRECTORY {
            return Ok(self.directory);
        }
        let slot = &self.opened[cell.index()];
        if slot.get().is_none() {
            let _ = slot.set((self.open)(cell)?);
        }
        Ok(slot.get().expect("set just above"))
    }

    /// The store of the cell that holds `node_id`.
    pub fn of_node(&self, node_id: &str) -> crate::Result<&Store<'a>> {
        self.store(self.cells.home_of(node_id))
    }

    /// Every cell's store, the directory's first.
    fn each(&self) -> impl Iterator<Item = crate::Result<&Store<'a>>> {
        self.cells.all().map(|cell| self.store(cell))
    }

    /// The stores this request opened so far.
    pub fn opened(&self) -> impl Iterator<Item = &Store<'a>> {
        std::iter::once(self.directory).chain(self.opened.iter().filter_map(OnceCell::get))
    }

    /// The nodes the caller may read, by id, from every cell: one statement per cell.
    pub fn list_nodes(
        &self,
        ctx: &Context<'_>,
        owner_org_id: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> crate::Result<Page<ListedNode>> {
        let limit = limit.clamp(1, crate::nodes::MAX_NODE_PAGE);
        let pages = self
            .each()
            .map(|store| store?.list_nodes(ctx, owner_org_id, after, limit))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(merged(
            pages,
            limit,
            |node| node.summary.id.clone(),
            Clone::clone,
            |node| node.summary.id.clone(),
        ))
    }

    /// The units for sale, by node then unit, from every cell (from the node's only, when
    /// the listing is of one node).
    pub fn read_market(
        &self,
        ctx: &Context<'_>,
        node_id: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> crate::Result<Page<Offer>> {
        if let Some(node) = node_id {
            return self.of_node(node)?.read_market(ctx, node_id, after, limit);
        }
        let limit = limit.clamp(1, reservations_domain::market::MAX_PAGE);
        let pages = self
            .each()
            .map(|store| store?.read_market(ctx, None, after, limit))
            .collect::<crate::Result<Vec<_>>>()?;
        let unreadable_key = |key: &String| {
            let (node, unit) = parse_cursor(key).unwrap_or((key.as_str(), ""));
            (node.to_owned(), unit.to_owned())
        };
        Ok(merged(
            pages,
            limit,
            |offer| (offer.node_id.clone(), offer.unit_id.clone()),
            unreadable_key,
            |offer| cursor_of(&offer.node_id, &offer.unit_id),
        ))
    }

    /// The VMs the caller may read, by id, from every cell (from the node's only, when the
    /// listing is of one node).
    pub fn list_vms(&self, ctx: &Context<'_>, filter: &VmFilter) -> crate::Result<Page<Vm>> {
        if let Some(node) = &filter.node_id {
            return self.of_node(node)?.list_vms(ctx, filter);
        }
        let limit = filter.limit.clamp(1, crate::vms::MAX_VM_PAGE);
        let pages = self
            .each()
            .map(|store| store?.list_vms(ctx, filter))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(merged(
            pages,
            limit,
            |vm| vm.id.clone(),
            Clone::clone,
            |vm| vm.id.clone(),
        ))
    }

    /// The VM `id`: in the cell its id names first (where it was placed), then in the
    /// others, where a node moved since took it.
    pub fn read_vm(&self, ctx: &Context<'_>, id: &str) -> crate::Result<Vm> {
        self.with_vm(id, |store| store.read_vm(ctx, id))
    }

    /// `operation` on the store of the cell that holds the VM `id`: the cell its id names,
    /// or, should it not be there (its node moved since), the first other cell that has it.
    pub fn with_vm<T>(
        &self,
        id: &str,
        operation: impl Fn(&Store<'a>) -> crate::Result<T>,
    ) -> crate::Result<T> {
        let named = self.cells.home_of(id);
        let first = operation(self.store(named)?);
        if !is_not_found(&first) {
            return first;
        }
        for cell in self.cells.all().filter(|cell| *cell != named) {
            let elsewhere = operation(self.store(cell)?);
            if !is_not_found(&elsewhere) {
                return elsewhere;
            }
        }
        first
    }
}

impl<'a> CellStores<'a> {
    /// Revokes a key of an org. With more than one cell, every other cell is told first,
    /// once the directory says the caller may revoke it, so that no cell's write statement
    /// takes the key once the revocation is answered; a cell that cannot be told fails the
    /// request before the directory records it, and the request may be sent again.
    pub fn revoke_key(
        &self,
        writer: &dyn WriteContext<ApiKey>,
        org_id: &str,
        key_id: &str,
    ) -> crate::Result<ApiKey> {
        self.tell_every_cell(writer.context(), Some(org_id), key_id)?;
        self.directory.revoke_key(writer, org_id, key_id)
    }

    /// Revokes an operator key, every other cell told first (see [`CellStores::revoke_key`]).
    pub fn revoke_operator_key(
        &self,
        writer: &dyn WriteContext<OperatorKey>,
        key_id: &str,
    ) -> crate::Result<OperatorKey> {
        self.tell_every_cell(writer.context(), None, key_id)?;
        self.directory.revoke_operator_key(writer, key_id)
    }

    fn tell_every_cell(
        &self,
        ctx: &Context<'_>,
        org_id: Option<&str>,
        key_id: &str,
    ) -> crate::Result<()> {
        if self.cells.count() == 1 {
            return Ok(());
        }
        self.directory.check_revocation(ctx, org_id, key_id)?;
        for cell in self.cells.all().skip(1) {
            self.store(cell)?.hold_revocation(key_id, ctx.now)?;
        }
        Ok(())
    }
}

fn is_not_found<T>(result: &crate::Result<T>) -> bool {
    matches!(
        result,
        Err(StoreError::Domain(DomainError::NotFound { .. }))
    )
}

/// One page of a listing that every cell orders the same way, from the pages each cell gave
/// from the same cursor (each at most `limit` rows, in order): the first `limit` rows of
/// them all, and a next cursor if any cell had more. A cell's rows past the page's last are
/// read again from its cursor, so nothing is skipped or listed twice.
pub(crate) fn merged<T, K: Ord>(
    pages: Vec<Page<T>>,
    limit: usize,
    key_of: impl Fn(&T) -> K,
    unreadable_key: impl Fn(&String) -> K,
    cursor_of: impl Fn(&T) -> String,
) -> Page<T> {
    let more = pages.iter().any(|page| page.next_cursor.is_some());
    let mut rows: Vec<(K, std::result::Result<T, UnreadableRow>)> = Vec::new();
    for page in pages {
        rows.extend(page.items.into_iter().map(|item| (key_of(&item), Ok(item))));
        rows.extend(
            page.unreadable
                .into_iter()
                .map(|row| (unreadable_key(&row.key), Err(row))),
        );
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let more = more || rows.len() > limit;
    rows.truncate(limit);
    let next_cursor = match rows.last() {
        Some((_, Ok(item))) if more => Some(cursor_of(item)),
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
        assert_eq!(Cells::new(3).unwrap().cell(2).unwrap().label(), "cell-2");
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
