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
//! A bookmark is 16 lowercase hex digits: opaque to clients, except that of two bookmarks the
//! greater, compared as strings, is the newer.

use reservations_store::Store;
use reservations_store::site::BOOKMARK_WAIT;
use spin_sdk::http::{Request, Response};

use crate::head::single_header;
use crate::problem::Problem;

pub const BOOKMARK_HEADER: &str = "bookmark";

/// The position a request's `Bookmark` asks for, if it sent one.
pub(crate) fn requested(
    request: &Request,
    repeated_headers: &[&'static str],
) -> Result<Option<i64>, Problem> {
    let Some(value) = single_header(request, repeated_headers, BOOKMARK_HEADER)? else {
        return Ok(None);
    };
    parse(value).map(Some).ok_or_else(|| {
        Problem::bad_request(
            "invalid-bookmark",
            "the Bookmark header must be a bookmark this API answered with (16 hex digits)",
        )
    })
}

fn parse(value: &str) -> Option<i64> {
    let valid = value.len() == 16
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    valid.then(|| i64::from_str_radix(value, 16).ok()).flatten()
}

pub fn format(position: i64) -> String {
    format!("{:016x}", position.max(0))
}

/// Whether the store's database has reached the bookmark's position, waiting for it a while.
/// A bookmark the site's copy has not reached is first checked against the primary: one
/// ahead of the primary was never answered by this API, and is refused at once.
pub(crate) fn reached(store: &Store<'_>, position: i64) -> Result<bool, Problem> {
    if store.latest_position()? >= position {
        return Ok(true);
    }
    // On the primary itself the position just read is the primary's; a primary out of reach
    // cannot tell, and the bookmark is waited for all the same.
    let ahead = match store.copy_may_lag() {
        false => true,
        true => matches!(store.primary_position(), Ok(primary) if position > primary),
    };
    if ahead {
        return Err(Problem::bad_request(
            "invalid-bookmark",
            "the bookmark is ahead of the database: it is not one this API answered with",
        ));
    }
    Ok(store.await_position(position, BOOKMARK_WAIT)?)
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

/// Gives a successful write's answer its bookmark.
pub(crate) fn stamp(response: &mut Response, store: &Store<'_>) -> Result<(), Problem> {
    if (200..300).contains(response.status()) {
        response.set_header(BOOKMARK_HEADER, format(store.bookmark_position()?));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bookmark_is_sixteen_hex_digits_ordered_as_strings() {
        assert_eq!(format(0), "0000000000000000");
        assert_eq!(format(42), "000000000000002a");
        assert_eq!(parse("000000000000002a"), Some(42));
        assert!(format(9) < format(10) && format(255) < format(4096));
        for bad in [
            "",
            "2a",
            "000000000000002A",
            "00000000000000zz",
            "0000000000000002a0",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
