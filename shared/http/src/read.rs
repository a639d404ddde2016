//! The reads the API has, one value per endpoint that reads ([`Read`]): what the request
//! names, checked, and nothing else. A read handler only builds one; the executor
//! ([`crate::execute`]) answers it with [`Read::answer`], which reads from the cell the
//! read's own fields name (a node's, a VM's, the directory) or from every cell, merging
//! their pages with the store's merges (`reservations_store::cells::merged` and its twins),
//! and renders the answer as a value.

use std::time::{Duration, Instant};

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_domain::ids::{Id, Node, Org, Vm};
use reservations_store::audit::{AuditFilter, ChainPin};
use reservations_store::cells::{
    Cell, CellStores, Cells, Positions, merged, merged_trail, merged_verifications,
};
use reservations_store::cursor::{Listing, Position};
use reservations_store::feed::{
    FeedWait, WAITS_OVERALL, WAITS_PER_KEY, WAITS_PER_ORG, WaitRefused,
};
use reservations_store::reservations::ReservationFilter;
use reservations_store::vms::VmFilter;
use reservations_store::{Context, Page, Store, StoreError};

use crate::auth::{OPERATOR_KEY_ID, random_hex};
use crate::input::{FromText, ReservationPath};
use crate::problem::Problem;
use crate::render::{self, Reply};

/// A read, as its endpoint names it.
pub enum Read {
    /// `GET /v1/whoami`: the caller.
    Caller,
    /// `GET /v1/orgs/{orgId}`.
    Org(Id<Org>),
    /// `GET /v1/orgs/{orgId}/keys`: a page of the org's keys.
    OrgKeys {
        org_id: Id<Org>,
        after: Option<Position>,
        limit: usize,
    },
    /// `GET /v1/operator/keys`: a page of the operators' keys.
    OperatorKeys {
        after: Option<Position>,
        limit: usize,
    },
    /// `GET /v1/nodes/{nodeId}`: the node, with how many of its units are for sale.
    Node(Id<Node>),
    /// `GET /v1/nodes`: a page of the nodes, optionally of one owner, from every cell.
    Nodes {
        owner_org_id: Option<String>,
        after: Option<String>,
        limit: usize,
        listing: Listing,
    },
    /// `GET /v1/market`: a page of the units for sale, by node then unit, from the node's
    /// cell when it names one, else from every cell.
    Market {
        node_id: Option<Id<Node>>,
        after: Option<(String, String)>,
        limit: usize,
        listing: Listing,
    },
    /// `GET /v1/nodes/{nodeId}/reservations/{id}`.
    Reservation(ReservationPath),
    /// `GET /v1/nodes/{nodeId}/reservations`: a page of the node's reservations.
    Reservations {
        node_id: Id<Node>,
        filter: ReservationFilter,
    },
    /// `GET /v1/vms/{id}`.
    Vm(Id<Vm>),
    /// `GET /v1/vms`: a page of the VMs, from the node's cell when the filter names one,
    /// else from every cell.
    Vms { filter: VmFilter, listing: Listing },
    /// `GET /v1/audit`: a page of the trail after `after` (the trail's start when absent).
    Trail {
        filter: AuditFilter,
        after: Option<TrailPosition>,
    },
    /// `GET /v1/events`: the events feed after `after`, waiting up to `wait` for one.
    Feed {
        after: Option<TrailPosition>,
        wait: Duration,
        limit: usize,
    },
    /// `GET /v1/audit/verify`: every chain, or only `only`, verified against `pins`.
    Chains {
        only: Option<String>,
        pins: Vec<ChainPin>,
    },
}

impl Read {
    /// The read's answer: read from the cells its fields name, rendered as a value.
    pub(crate) fn answer(
        self,
        stores: &CellStores<'_>,
        ctx: &Context<'_>,
    ) -> Result<Reply, Problem> {
        let caller = ctx.caller;
        let reply = match self {
            Read::Caller => Reply::ok(render::whoami(caller)),
            Read::Org(org_id) => {
                let org = stores.directory().identity().read_org(ctx, &org_id)?;
                Reply::ok(render::org(&org))
            }
            Read::OrgKeys {
                org_id,
                after,
                limit,
            } => {
                let page =
                    stores
                        .directory()
                        .identity()
                        .list_keys(ctx, &org_id, after.as_ref(), limit)?;
                Reply::ok(render::page(&page, caller, render::api_key))
            }
            Read::OperatorKeys { after, limit } => {
                let page =
                    stores
                        .directory()
                        .identity()
                        .list_operator_keys(ctx, after.as_ref(), limit)?;
                Reply::ok(render::page(&page, caller, render::operator_key))
            }
            Read::Node(node_id) => {
                let store = stores.of_node(&node_id);
                let (node, for_sale) = store.capacity().read_node(ctx, &node_id)?;
                Reply::ok(render::node_with_sales(&node, for_sale))
            }
            Read::Nodes {
                owner_org_id,
                after,
                limit,
                listing,
            } => {
                let pages = stores
                    .all()
                    .map(|(_, store)| {
                        let owner = owner_org_id.as_deref();
                        store
                            .capacity()
                            .list_nodes(ctx, owner, after.as_deref(), limit)
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let page = resumable(merged(pages, limit), &listing);
                Reply::ok(render::page(&page, caller, render::listed_node))
            }
            Read::Market {
                node_id,
                after,
                limit,
                listing,
            } => {
                let after = after
                    .as_ref()
                    .map(|(node, unit)| (node.as_str(), unit.as_str()));
                let node = node_id.as_deref();
                let pages = stores
                    .cells_of(node)
                    .into_iter()
                    .map(|cell| {
                        stores
                            .store(cell)
                            .market()
                            .read_market(ctx, node, after, limit)
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let page = resumable(merged(pages, limit), &listing);
                Reply::ok(render::page(&page, caller, render::offer))
            }
            Read::Reservation(path) => {
                let store = stores.of_node(&path.node_id);
                let reservation =
                    store
                        .capacity()
                        .read_reservation(ctx, &path.node_id, &path.id)?;
                Reply::ok(render::reservation(&reservation, ctx.now))
            }
            Read::Reservations { node_id, filter } => {
                let store = stores.of_node(&node_id);
                let page = store.capacity().list_reservations(ctx, &node_id, &filter)?;
                Reply::ok(render::page(&page, caller, |r| {
                    render::reservation(r, ctx.now)
                }))
            }
            Read::Vm(id) => {
                let vm = vm_in_any_cell(stores, ctx, &id)?;
                Reply::ok(render::vm(&vm, caller))
            }
            Read::Vms { filter, listing } => {
                let pages = stores
                    .cells_of(filter.node_id.as_deref())
                    .into_iter()
                    .map(|cell| stores.store(cell).capacity().list_vms(ctx, &filter))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let page = resumable(merged(pages, filter.limit), &listing);
                Reply::ok(render::page(&page, caller, |vm| render::vm(vm, caller)))
            }
            Read::Trail { filter, after } => trail(stores, caller, filter, after)?,
            Read::Feed { after, wait, limit } => feed(stores, ctx, after, wait, limit)?,
            Read::Chains { only, pins } => {
                let cells = match &only {
                    Some(chain) => vec![stores.cell_of_chain(chain)],
                    None => stores.cells().all().collect(),
                };
                let verifications = cells
                    .into_iter()
                    .map(|cell| {
                        let own: Vec<ChainPin> = pins
                            .iter()
                            .filter(|pin| stores.cell_of_chain(&pin.chain) == cell)
                            .cloned()
                            .collect();
                        let trail = stores.store(cell).trail();
                        trail.verify_audit(caller, only.as_deref(), &own)
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Reply::ok(merged_verifications(verifications))
            }
        };
        Ok(reply)
    }
}

/// A merged page whose next cursor resumes `listing` (what the cells' pages give is a key).
fn resumable<T>(mut page: Page<T>, listing: &Listing) -> Page<T> {
    page.next_cursor = page.next_cursor.map(|key| listing.cursor_after_key(&key));
    page
}

/// The VM `id`: in the cell its id names first (where it was placed), then in the others,
/// where a node moved since took it.
fn vm_in_any_cell(
    stores: &CellStores<'_>,
    ctx: &Context<'_>,
    id: &str,
) -> Result<reservations_domain::vm::Vm, StoreError> {
    let mut first = None;
    for cell in stores.cells_for_vm(id) {
        let read = stores.store(cell).capacity().read_vm(ctx, id);
        if !read.as_ref().is_err_and(StoreError::is_not_found) {
            return read;
        }
        first.get_or_insert(read);
    }
    first.expect("a cell names every id")
}

/// A page of the trail as `caller` may read it, after `after`: from every cell, or from
/// the node's only when the filter names a node; the next cursor is where the reader
/// stands in every cell.
fn trail(
    stores: &CellStores<'_>,
    caller: &Caller,
    filter: AuditFilter,
    after: Option<TrailPosition>,
) -> Result<Reply, Problem> {
    let after = TrailPosition::in_cells(after.as_ref(), stores.cells(), "cursor")?;
    let pages = stores
        .cells_of(filter.node_id.as_deref())
        .into_iter()
        .map(|cell| {
            let in_cell = AuditFilter {
                after_seq: Some(after.get(cell)),
                ..filter.clone()
            };
            let page = stores.store(cell).trail().read_audit(caller, in_cell)?;
            Ok((cell, page))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let trail = merged_trail(pages, &after, filter.limit);
    let page = Page {
        items: trail.rows.into_iter().map(|(_, row)| row).collect(),
        next_cursor: trail.more.then(|| trail.next.format()),
        unreadable: Vec::new(),
    };
    Ok(Reply::ok(render::page_of_some(&page, caller, |row| {
        render::audit_row(row, caller)
    })))
}

/// How often a waiting feed looks at the head of what the caller may see (one primary-key
/// probe each time, which also checks that the caller's key still holds).
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The events feed (docs/design.md, "The events feed"): the events the caller may see after
/// `after`, in order. With none yet and a `wait`, it takes one of the bounded places of
/// waiting polls (else 429 for a key or an org that holds its share, 503 when the deployment
/// holds all, with `Retry-After`), waits up to `wait` looking only at the head of what the
/// caller may see in each cell, and answers as soon as a visible event arrives, or 401 as
/// soon as its key is revoked. `nextCursor` is always given: the point up to which the
/// caller's own events were read, so a resumed poll never reads them again and tells nothing
/// of other orgs' activity.
fn feed(
    stores: &CellStores<'_>,
    ctx: &Context<'_>,
    after: Option<TrailPosition>,
    wait: Duration,
    limit: usize,
) -> Result<Reply, Problem> {
    let caller = ctx.caller;
    let directory = stores.directory();
    let mut after = TrailPosition::in_cells(after.as_ref(), stores.cells(), "after")?;
    let deadline = Instant::now() + wait;
    // A poll that means to wait and that a bound refuses is refused before any cell is read:
    // a flood of one key's polls then costs its key's look-up and one read of the directory
    // each, whatever the number of cells.
    if !wait.is_zero()
        && let Some(refused) = directory.feed().feed_wait_refused(caller, ctx.now)?
    {
        return Err(wait_refused(refused));
    }
    let mut place = WaitingPlace::none(directory, caller, ctx.now);
    loop {
        let heads = match feed_heads(stores, caller) {
            Ok(heads) => heads,
            // A waiting poll skips a look the database could not answer (busy, or out of
            // reach for a moment): the next one asks again, up to the deadline.
            Err(e) if e.is_transient() && place.is_held() && Instant::now() < deadline => {
                std::thread::sleep(POLL_INTERVAL);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Some(heads) = heads else {
            return Err(Problem::unauthorized("the token is unknown or revoked"));
        };
        if !after.covers(&heads) {
            let pages = stores
                .cells()
                .all()
                .filter(|cell| heads.get(*cell) > after.get(*cell))
                .map(|cell| {
                    let feed = stores.store(cell).feed();
                    let page = feed.read_feed(caller, after.get(cell), heads.get(cell), limit)?;
                    Ok((cell, page))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let page = merged_trail(pages, &after, limit);
            // Read to the heads, the poll resumes from them: past events it may not see.
            let mut next = page.next.clone();
            if !page.more {
                next.join(&heads);
            }
            let items: Vec<_> = page
                .rows
                .iter()
                .filter_map(|(_, row)| render::feed_row(row, caller))
                .collect();
            if !items.is_empty() || page.more {
                return Ok(Reply::ok(render::feed(items, next.format())));
            }
            after = next;
        }
        if Instant::now() >= deadline {
            return Ok(Reply::ok(render::feed(
                Vec::<render::AuditRowBody<'_>>::new(),
                after.format(),
            )));
        }
        place.take(deadline)?;
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The newest event `caller` may see in each cell, one statement per cell; `None` once the
/// caller's key no longer holds (asked of the directory, which has it).
fn feed_heads(stores: &CellStores<'_>, caller: &Caller) -> Result<Option<Positions>, StoreError> {
    let mut heads = Positions::start(stores.cells());
    for (cell, store) in stores.all() {
        let seq = if cell == Cell::DIRECTORY {
            let head = store.feed().feed_head(caller, OPERATOR_KEY_ID)?;
            if !head.key_valid {
                return Ok(None);
            }
            head.seq
        } else {
            store.feed().events_head(caller)?
        };
        heads.advance(cell, seq);
    }
    Ok(Some(heads))
}

/// The place a waiting poll holds among the bounded waits, given back when the poll answers
/// (and lapsing by itself should the instance be stopped first).
struct WaitingPlace<'s> {
    directory: &'s Store<'s>,
    caller: &'s Caller,
    now: Timestamp,
    held: Option<FeedWait>,
}

impl<'s> WaitingPlace<'s> {
    fn none(directory: &'s Store<'s>, caller: &'s Caller, now: Timestamp) -> Self {
        WaitingPlace {
            directory,
            caller,
            now,
            held: None,
        }
    }

    fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Takes a place for a wait until `deadline`, unless one is held already.
    fn take(&mut self, deadline: Instant) -> Result<(), Problem> {
        if self.held.is_some() {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        // The place lapses a little after the poll's last answer could have gone.
        let until = self.now
            + chrono::Duration::from_std(remaining).unwrap_or_default()
            + chrono::Duration::seconds(2);
        let id = format!("wait-{}", random_hex(8));
        let caller = self.caller;
        match self.directory.feed().begin_feed_wait(
            &caller.key_id,
            caller.org_id.as_deref(),
            &id,
            self.now,
            until,
        )? {
            Ok(wait) => {
                self.held = Some(wait);
                Ok(())
            }
            Err(refused) => Err(wait_refused(refused)),
        }
    }
}

impl Drop for WaitingPlace<'_> {
    fn drop(&mut self) {
        if let Some(wait) = self.held.take() {
            // Should this fail, the place lapses at its end.
            let _ = self.directory.feed().end_feed_wait(wait);
        }
    }
}

/// A poll a bound refuses a place: 429 for a key or an org that holds its share, 503 when the
/// deployment holds all, with `Retry-After` the time the earliest of those places lapses.
fn wait_refused(refused: WaitRefused) -> Problem {
    let (problem, retry_after_secs) = match refused {
        WaitRefused::KeyBusy { retry_after_secs } => (
            Problem::new(
                429,
                "too-many-waits",
                "Too many waiting polls",
                format!(
                    "this key already has {WAITS_PER_KEY} polls waiting; resume with one of them, or retry without wait"
                ),
            ),
            retry_after_secs,
        ),
        WaitRefused::OrgBusy { retry_after_secs } => (
            Problem::new(
                429,
                "too-many-org-waits",
                "Too many waiting polls of this org",
                format!(
                    "this org's keys already have {WAITS_PER_ORG} polls waiting; resume with one of them, or retry without wait"
                ),
            ),
            retry_after_secs,
        ),
        WaitRefused::ServiceBusy { retry_after_secs } => (
            Problem::new(
                503,
                "waits-exhausted",
                "No room for another waiting poll",
                format!(
                    "{WAITS_OVERALL} polls are waiting across the service; retry later, or without wait"
                ),
            ),
            retry_after_secs,
        ),
    };
    problem.with_header("retry-after", retry_after_secs.to_string())
}

/// A position in the audit trail of every cell, as its listings and the events feed hand
/// it out (`reservations_store::cells::Positions`): checked for its form as it is parsed,
/// and read against the deployment's cells when the read is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrailPosition(String);

impl FromText for TrailPosition {
    fn from_text(text: &str) -> Result<Self, String> {
        Positions::parse(text, Cells::new(Cells::MAX).expect("the most cells"))
            .map(|_| TrailPosition(text.to_owned()))
            .ok_or_else(|| "is not a cursor this API issued".to_owned())
    }
}

impl TrailPosition {
    /// Where `sent` (absent: the trail's start) stands in each of `cells`; 400 naming
    /// `parameter` if it names more cells than there are.
    fn in_cells(
        sent: Option<&TrailPosition>,
        cells: Cells,
        parameter: &'static str,
    ) -> Result<Positions, Problem> {
        let Some(sent) = sent else {
            return Ok(Positions::start(cells));
        };
        Positions::parse(&sent.0, cells).ok_or_else(|| {
            Problem::bad_request(
                "invalid-parameter",
                format!("{parameter} is not a cursor this API issued"),
            )
            .with("parameter", parameter)
        })
    }
}

crate::deserialize_from_text!(TrailPosition);
