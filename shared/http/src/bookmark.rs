//! Bookmarks: read what you wrote at any site (docs/design.md, "Edge sites" and "Bookmarks
//! are sealed").
//!
//! Every successful write answers with a `Bookmark` header: the position the database had
//! reached with the write (see `reservations_store::site`). A request that sends a bookmark
//! back, at any site, is served from state at least that new: the site's copy is waited for
//! (a bounded wait), and a read it does not reach in time is refused with a 503 rather than
//! answered from older state. A write needs no such wait to be right (its statement checks
//! every fact at the primary), but it waits the same, so that it plans on what the caller saw.
//!
//! A bookmark is a position in every cell (`reservations_store::cells::Positions`), each
//! cell's past its start sealed by a tag only this API can make (an HMAC under a key derived
//! from the audit key): `p1234-<16 hex>` with one cell, `p1234-<tag>.0.56-<tag>.0` with four.
//! A request's bookmark is read only once its caller is known, and one any of whose tags is
//! not this API's is refused 400 `invalid-bookmark` whatever it holds, so no caller learns
//! from a bookmark how far the database has come beyond what it was given. A write's
//! bookmark covers the bookmark its request sent, so the last one a client was given covers
//! everything it did; a client that keeps several may join them cell by cell, each cell's
//! greater position with its own tag.
//!
//! This file is the bookmark's form and seal; which cells' databases a request compares
//! with it, and what a write's answer is stamped with, the executor decides
//! ([`crate::execute`]).

use hmac::{Hmac, Mac};

use reservations_store::cells::{Cell, Cells, Positions};

use sha2::Sha256;
use spin_sdk::http::Request;

use crate::auth::constant_time_eq;
use crate::problem::Problem;
use crate::routes::single_header;

pub const BOOKMARK_HEADER: &str = "bookmark";

/// Hex digits of a cell's tag: 64 bits, each guess a request of its own.
const TAG_HEX: usize = 16;

/// A `Bookmark` as a request sent it, read but not yet checked: each cell's position and
/// the tag beside it.
#[derive(Debug)]
pub(crate) struct SentBookmark(Vec<(i64, Option<String>)>);

/// Makes and checks the tags of bookmarks: an HMAC-SHA256 key of their own, derived from the
/// audit key, so a bookmark's tag is never an audit hash or the other way round.
pub(crate) struct BookmarkSeal {
    key: Hmac<Sha256>,
}

impl BookmarkSeal {
    pub(crate) fn new(audit_key: &[u8]) -> BookmarkSeal {
        let derived = Hmac::<Sha256>::new_from_slice(audit_key)
            .expect("HMAC takes a key of any length")
            .chain_update(b"reservations bookmark tags v1")
            .finalize()
            .into_bytes();
        BookmarkSeal {
            key: Hmac::new_from_slice(&derived).expect("HMAC takes a key of any length"),
        }
    }

    /// The tag of `position` in `cell`.
    fn tag(&self, cell: Cell, position: i64) -> String {
        let digest = self
            .key
            .clone()
            .chain_update(format!("{}:{position}", cell.index()).as_bytes())
            .finalize()
            .into_bytes();
        hex::encode(&digest[..TAG_HEX / 2])
    }

    /// The text a client is given for `at`.
    pub(crate) fn format(&self, at: &Positions, cells: Cells) -> String {
        let parts: Vec<String> = cells
            .all()
            .map(|cell| match at.get(cell) {
                0 => "0".to_owned(),
                position => format!("{position}-{}", self.tag(cell, position)),
            })
            .collect();
        format!("p{}", parts.join("."))
    }

    /// The positions a sent bookmark holds, if this API sealed every one of them.
    pub(crate) fn open(&self, sent: &SentBookmark, cells: Cells) -> Result<Positions, Problem> {
        let mut at = Positions::start(cells);
        for (cell, (position, tag)) in cells.all().zip(&sent.0) {
            match tag {
                None => {}
                Some(tag)
                    if constant_time_eq(tag.as_bytes(), self.tag(cell, *position).as_bytes()) =>
                {
                    at.advance(cell, *position)
                }
                Some(_) => return Err(not_issued()),
            }
        }
        Ok(at)
    }
}

/// The bookmark a request sent, if any, read as text: 400 for one that is not of the form
/// this API answers with. Its tags are checked once the caller is known
/// ([`BookmarkSeal::open`]).
pub(crate) fn requested(
    request: &Request,
    repeated_headers: &[&'static str],
    cells: Cells,
) -> Result<Option<SentBookmark>, Problem> {
    let Some(value) = single_header(request, repeated_headers, BOOKMARK_HEADER)? else {
        return Ok(None);
    };
    parse(value, cells).map(Some).ok_or_else(not_issued)
}

/// The positions of a bookmark this API sealed, from its text (a home's answer, say); `None`
/// for any other.
pub(crate) fn opened(seal: &BookmarkSeal, text: &str, cells: Cells) -> Option<Positions> {
    seal.open(&parse(text, cells)?, cells).ok()
}

/// Each cell's `0`, or its position and tag, from `p…` text; `None` if it is not of that
/// form or names more cells than there are.
fn parse(text: &str, cells: Cells) -> Option<SentBookmark> {
    let parts: Vec<&str> = text.strip_prefix('p')?.split('.').collect();
    if parts.len() > cells.count() {
        return None;
    }
    let mut sent = Vec::with_capacity(parts.len());
    for part in parts {
        if part == "0" {
            sent.push((0, None));
            continue;
        }
        let (number, tag) = part.split_once('-')?;
        // A tagged position is past its cell's start.
        let position = Positions::parse_one(number).filter(|position| *position > 0)?;
        let tag_ok = tag.len() == TAG_HEX
            && tag
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !tag_ok {
            return None;
        }
        sent.push((position, Some(tag.to_owned())));
    }
    Some(SentBookmark(sent))
}

fn not_issued() -> Problem {
    Problem::bad_request(
        "invalid-bookmark",
        "the Bookmark header must be a bookmark this API answered with",
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(count: usize) -> Cells {
        Cells::new(count).unwrap()
    }

    fn sealed(seal: &BookmarkSeal, numbers: &[i64]) -> String {
        let mut at = Positions::start(cells(numbers.len()));
        for (cell, n) in cells(numbers.len()).all().zip(numbers) {
            at.advance(cell, *n);
        }
        seal.format(&at, cells(numbers.len()))
    }

    fn opened(seal: &BookmarkSeal, text: &str, count: usize) -> Option<Positions> {
        seal.open(&parse(text, cells(count))?, cells(count)).ok()
    }

    #[test]
    fn a_bookmark_opens_only_as_this_api_sealed_it() {
        let seal = BookmarkSeal::new(b"audit key");
        let text = sealed(&seal, &[574, 0, 12, 0]);
        assert!(text.starts_with("p574-"), "{text}");
        let at = opened(&seal, &text, 4).expect("its own bookmark");
        assert_eq!(at.format(), "p574.0.12.0");
        // Read in a deployment of more cells, the cells it does not name are at their start.
        assert_eq!(opened(&seal, &text, 6).unwrap().format(), "p574.0.12.0.0.0");
        assert!(
            opened(&seal, &text, 3).is_none(),
            "more cells than there are"
        );

        // Another key's, a position moved, a tag moved to another cell, and positions
        // without tags: refused alike.
        let other = sealed(&BookmarkSeal::new(b"another key"), &[574, 0, 12, 0]);
        let tag = &text[5..5 + TAG_HEX];
        for forged in [
            other.as_str(),
            &text.replacen("p574-", "p575-", 1),
            &format!("p0.574-{tag}"),
            "p574.0.12.0",
            "p0.99999999.0.0",
            &format!("p574-{}", &tag[..TAG_HEX - 1]),
            &format!("p574-{}", tag.to_uppercase()),
            &format!("p0574-{tag}"),
        ] {
            assert!(opened(&seal, forged, 4).is_none(), "{forged}");
        }
        assert_eq!(opened(&seal, "p0.0", 4).unwrap().format(), "p0.0.0.0");
    }

    #[test]
    fn sealed_cells_join_one_by_one() {
        let seal = BookmarkSeal::new(b"audit key");
        let a = sealed(&seal, &[5, 0, 9]);
        let b = sealed(&seal, &[7, 3, 0]);
        let part = |text: &str, i: usize| text[1..].split('.').nth(i).unwrap().to_owned();
        let joined = format!("p{}.{}.{}", part(&b, 0), part(&b, 1), part(&a, 2));
        assert_eq!(opened(&seal, &joined, 3).unwrap().format(), "p7.3.9");
    }
}
