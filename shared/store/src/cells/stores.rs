//! The stores of a request, one per cell, and what spans cells: listings merged from every
//! cell (docs/design.md, "Cells").

use reservations_domain::market::{Offer, cursor_of, parse_cursor};
use reservations_domain::vm::Vm;

use reservations_domain::access::Caller;

use super::{Cell, Cells, Positions};
use crate::audit::{AuditFilter, ChainPin, ChainVerification, Listed};
use crate::keys::{ApiKey, OperatorKey};
use crate::nodes::ListedNode;
use crate::vms::VmFilter;
use crate::write::NODE_CHAIN_PREFIX;
use crate::{Context, Page, Store, StoreError, UnreadableRow};

/// The stores of a request, one per cell: a request about one node sends statements to its
/// cell only (and the directory, for the caller's key). What spans cells reads each and
/// merges (the listings below). A store sends nothing until it is asked something, so having
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
            .all()
            .map(|(_, store)| store.capacity().list_nodes(ctx, owner_org_id, after, limit))
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
            return self
                .of_node(node)
                .market()
                .read_market(ctx, node_id, after, limit);
        }
        let limit = limit.clamp(1, reservations_domain::market::MAX_PAGE);
        let pages = self
            .all()
            .map(|(_, store)| store.market().read_market(ctx, None, after, limit))
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
            return self.of_node(node).capacity().list_vms(ctx, filter);
        }
        let limit = filter.limit.clamp(1, crate::vms::MAX_VM_PAGE);
        let pages = self
            .all()
            .map(|(_, store)| store.capacity().list_vms(ctx, filter))
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
        self.with_vm(id, |store| store.capacity().read_vm(ctx, id))
    }

    /// `operation` on the store of the cell that holds the VM `id` (see
    /// [`CellStores::cells_for_vm`]): the first cell where it finds the VM.
    pub fn with_vm<T>(
        &self,
        id: &str,
        operation: impl Fn(&Store<'a>) -> crate::Result<T>,
    ) -> crate::Result<T> {
        let mut cells = self.cells_for_vm(id);
        let first = operation(self.store(cells.next().expect("a cell names every id")));
        if !first.as_ref().is_err_and(StoreError::is_not_found) {
            return first;
        }
        for cell in cells {
            let elsewhere = operation(self.store(cell));
            if !elsewhere.as_ref().is_err_and(StoreError::is_not_found) {
                return elsewhere;
            }
        }
        first
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

/// What the head of the events feed looks like to a caller across cells.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedHeads {
    /// Whether the caller's key still holds (asked of the directory, which has it).
    pub key_valid: bool,
    /// The newest event the caller may see in each cell.
    pub heads: Positions,
}

impl<'a> CellStores<'a> {
    /// The cell that holds the chain `chain`: a node's chain is its node's cell's, the
    /// platform's and earlier builds' are the directory's.
    pub fn cell_of_chain(&self, chain: &str) -> Cell {
        match chain.strip_prefix(NODE_CHAIN_PREFIX) {
            Some(node) => self.cells.home_of(node),
            None => Cell::DIRECTORY,
        }
    }

    /// A page of the audit trail as `caller` may read it, after `after`: from every cell, or
    /// from the node's only when the filter names a node. `filter.after_seq` is each cell's.
    pub fn read_audit(
        &self,
        caller: &Caller,
        filter: AuditFilter,
        after: &Positions,
    ) -> crate::Result<TrailPage> {
        let cells = self.cells_of(filter.node_id.as_deref());
        self.merged_trail(&cells, after, filter.limit, |_, store, after_seq| {
            store.trail().read_audit(
                caller,
                AuditFilter {
                    after_seq: Some(after_seq),
                    ..filter.clone()
                },
            )
        })
    }

    /// Where the events feed stands for `caller`: whether its key holds, and the newest
    /// event it may see in each cell. One statement per cell.
    pub fn feed_head(&self, caller: &Caller, bootstrap_key_id: &str) -> crate::Result<FeedHeads> {
        let mut heads = Positions::start(self.cells);
        let mut key_valid = false;
        for cell in self.cells.all() {
            let store = self.store(cell);
            let seq = if cell == Cell::DIRECTORY {
                let head = store.feed().feed_head(caller, bootstrap_key_id)?;
                key_valid = head.key_valid;
                head.seq
            } else {
                store.feed().events_head(caller)?
            };
            heads.advance(cell, seq);
        }
        Ok(FeedHeads { key_valid, heads })
    }

    /// The events of the feed `caller` may see after `after` and up to `up_to`, from every
    /// cell that has any.
    pub fn read_feed(
        &self,
        caller: &Caller,
        after: &Positions,
        up_to: &Positions,
        limit: usize,
    ) -> crate::Result<TrailPage> {
        let cells: Vec<Cell> = self
            .cells
            .all()
            .filter(|cell| up_to.get(*cell) > after.get(*cell))
            .collect();
        self.merged_trail(&cells, after, limit, |cell, store, after_seq| {
            store
                .feed()
                .read_feed(caller, after_seq, up_to.get(cell), limit)
        })
    }

    /// Every chain (or only `only`) verified in the cell that holds it, each given the pins
    /// of its own chains; the first broken chain (by name) is named.
    pub fn verify_audit(
        &self,
        caller: &Caller,
        only: Option<&str>,
        pins: &[ChainPin],
    ) -> crate::Result<ChainVerification> {
        let cells = match only {
            Some(chain) => vec![self.cell_of_chain(chain)],
            None => self.cells.all().collect(),
        };
        let mut verifications = Vec::new();
        for cell in cells {
            let own: Vec<ChainPin> = pins
                .iter()
                .filter(|pin| self.cell_of_chain(&pin.chain) == cell)
                .cloned()
                .collect();
            verifications.push(self.store(cell).trail().verify_audit(caller, only, &own)?);
        }
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
        Ok(merged)
    }

    /// The cells a listing reads: the node's, or all.
    fn cells_of(&self, node_id: Option<&str>) -> Vec<Cell> {
        match node_id {
            Some(node) => vec![self.cells.home_of(node)],
            None => self.cells.all().collect(),
        }
    }

    /// A page of the trail from `cells`: each cell's events after its position, in its own
    /// order, merged by the time they record (earliest first, a cell's events never
    /// reordered), the first `limit` kept; the reader's position moves in each cell to the
    /// last event kept from it. One statement per cell.
    fn merged_trail(
        &self,
        cells: &[Cell],
        after: &Positions,
        limit: usize,
        read: impl Fn(Cell, &Store<'a>, i64) -> crate::Result<Page<Listed>>,
    ) -> crate::Result<TrailPage> {
        let limit = limit.clamp(1, crate::audit::MAX_AUDIT_PAGE);
        let mut streams = Vec::new();
        for &cell in cells {
            let page = read(cell, self.store(cell), after.get(cell))?;
            let more = page.next_cursor.is_some();
            streams.push((cell, page.items.into_iter().peekable(), more));
        }
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
        Ok(TrailPage { rows, next, more })
    }
}

/// Where a row of the trail falls in a merged page: an event by the time it records; a row
/// that cannot be read first (its cell's order keeps it after the events before it).
fn trail_key(row: &Listed) -> i64 {
    match row {
        Listed::Event(event) => event.at.timestamp_millis(),
        Listed::Unreadable { .. } => i64::MIN,
    }
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
