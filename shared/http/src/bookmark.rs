//! Bookmarks: read what you wrote at any site (docs/design.md, "Edge sites").
//!
//! Every successful write answers with a `Bookmark` header: the position the database had
//! reached with the write (see `reservations_store::site`). A request that sends a bookmark
//! back, at any site, is served from state at least that new: the site's copy is waited for
//! (a bounded wait), and a read it does not reach in time is refused with a 503 rather than
//! answered from older state; a bookmark ahead of the primary is refused at once (400). A
//! write needs no such wait to be right (its statement checks every fact at the primary), but
//! it waits the same, so that it plans on what the caller saw.
//!
//! A bookmark is a position in every cell (`reservations_store::cells::Positions`, e.g.
//! `p1234` with one cell): opaque to clients, who send back the newest they were given. A
//! write's bookmark covers the bookmark its request sent too, so the last one a client was
//! given covers everything it did.

use reservations_store::Store;
use reservations_store::cells::{Cell, CellStores, Cells, Positions};
use reservations_store::site::BookmarkReach;
use spin_sdk::http::{Request, Response};

use crate::head::single_header;
use crate::problem::Problem;

pub const BOOKMARK_HEADER: &str = "bookmark";

/// The position a request's `Bookmark` asks for, if it sent one.
pub(crate) fn requested(
    request: &Request,
    repeated_headers: &[&'static str],
    cells: Cells,
) -> Result<Option<Positions>, Problem> {
    let Some(value) = single_header(request, repeated_headers, BOOKMARK_HEADER)? else {
        return Ok(None);
    };
    Positions::parse(value, cells).map(Some).ok_or_else(|| {
        Problem::bad_request(
            "invalid-bookmark",
            "the Bookmark header must be a bookmark this API answered with",
        )
    })
}

/// Whether the databases of `cells` (those the request reads: its home's, or every cell
/// the bookmark names) have reached the bookmark's positions, waiting for them a while.
pub(crate) fn reached(
    stores: &CellStores<'_>,
    wanted: &Positions,
    cells: Option<Cell>,
) -> Result<bool, Problem> {
    for (cell, position) in wanted.past_start() {
        if cells.is_some_and(|only| only != cell) {
            continue;
        }
        if !cell_reached(stores.store(cell), position)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether one cell's database has reached `position`, waiting for it a while; a position
/// ahead of the primary was never answered by this API, and is refused at once.
fn cell_reached(store: &Store<'_>, position: i64) -> Result<bool, Problem> {
    match store.bookmark_reach(position)? {
        BookmarkReach::Reached => Ok(true),
        BookmarkReach::NotInTime => Ok(false),
        BookmarkReach::AheadOfThePrimary => Err(Problem::bad_request(
            "invalid-bookmark",
            "the bookmark is ahead of the database: it is not one this API answered with",
        )),
    }
}

/// The refusal of a read whose bookmark the site's copy did not reach in time: it is cut off
/// from the primary, or far behind it.
pub(crate) fn not_reached() -> Problem {
    Problem::new(
        503,
        "site-behind",
        "Site behind",
        "this site's copy of the database has not reached the bookmark sent; retry the request",
    )
    .with_header("retry-after", "1")
}

/// Gives a successful write's answer its bookmark: the one the request sent, moved up in
/// its home cell to what the write did there (or the cell has reached), and in any other
/// cell it wrote.
pub(crate) fn stamp(
    response: &mut Response,
    stores: &CellStores<'_>,
    home: Cell,
    sent: Option<&Positions>,
) -> Result<(), Problem> {
    if !(200..300).contains(response.status()) {
        return Ok(());
    }
    let mut at = sent
        .cloned()
        .unwrap_or_else(|| Positions::start(stores.cells()));
    at.advance(home, stores.store(home).bookmark_position()?);
    for (cell, store) in stores.all() {
        at.advance(cell, store.seen_position());
    }
    response.set_header(BOOKMARK_HEADER, at.format());
    Ok(())
}
