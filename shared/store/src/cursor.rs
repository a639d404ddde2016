//! Cursors of the listings: those ordered by creation (a node's reservations, an org's keys,
//! the operators' keys) and those ordered by id across cells (nodes, VMs, the market).
//!
//! A cursor carries its own position, the creation time and id of the last item of its page,
//! and names the listing it belongs to (its path and who lists it). Resuming reads no row the
//! client names, so a cursor tells nothing of objects outside the caller's listing: one made
//! for another listing, or one that is not a cursor at all, is refused alike, whatever it
//! names. The text is opaque to clients (hex), and any position it holds is merely a point in
//! the listing's order.

use reservations_domain::access::Caller;

use crate::storage::Row;
use crate::storage::{SqlValue, StorageError};

/// Where a listing resumes: after the row with this creation time and id (as stored, so
/// that a row whose columns cannot be read still has its place).
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub(crate) created_at: SqlValue,
    pub(crate) id: SqlValue,
}

impl Position {
    /// The position of a listed row, from its `created_at` and `id` columns.
    pub(crate) fn of_row(row: &Row<'_>) -> Result<Position, StorageError> {
        Ok(Position {
            created_at: row.value("created_at")?.clone(),
            id: row.value("id")?.clone(),
        })
    }
}

/// A listing cursors belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing(String);

impl Listing {
    /// The reservations of `node_id` as `caller` lists them.
    pub fn reservations(node_id: &str, caller: &Caller) -> Listing {
        Listing(format!("reservations {node_id} {}", lister(caller)))
    }

    /// The keys of `org_id` as `caller` lists them.
    pub fn org_keys(org_id: &str, caller: &Caller) -> Listing {
        Listing(format!("keys {org_id} {}", lister(caller)))
    }

    /// The operators' keys.
    pub fn operator_keys() -> Listing {
        Listing("operator-keys".to_owned())
    }

    /// The nodes as `caller` lists them (ordered by id).
    pub fn nodes(caller: &Caller) -> Listing {
        Listing(format!("nodes {}", lister(caller)))
    }

    /// The VMs as `caller` lists them (ordered by id).
    pub fn vms(caller: &Caller) -> Listing {
        Listing(format!("vms {}", lister(caller)))
    }

    /// The market as `caller` lists it (ordered by node, then unit).
    pub fn market(caller: &Caller) -> Listing {
        Listing(format!("market {}", lister(caller)))
    }

    /// The cursor that resumes this listing, ordered by a key, after the item with `key`.
    pub fn cursor_after_key(&self, key: &str) -> String {
        hex_of(&format!("{}\n{key}", self.0))
    }

    /// The key a cursor of this listing resumes after; `None` when `cursor` is not one.
    pub fn key(&self, cursor: &str) -> Option<String> {
        let text = String::from_utf8(from_hex(cursor)?).ok()?;
        let (listing, key) = text.split_once('\n')?;
        (listing == self.0 && !key.is_empty()).then(|| key.to_owned())
    }

    /// The cursor that resumes this listing after `position`.
    pub(crate) fn cursor(&self, position: &Position) -> String {
        hex_of(&format!(
            "{}\n{}\n{}",
            self.0,
            value_text(&position.created_at),
            value_text(&position.id)
        ))
    }

    /// The position a cursor of this listing holds; `None` when `cursor` is not one.
    pub fn position(&self, cursor: &str) -> Option<Position> {
        let text = String::from_utf8(from_hex(cursor)?).ok()?;
        let mut parts = text.splitn(3, '\n');
        if parts.next()? != self.0 {
            return None;
        }
        Some(Position {
            created_at: parse_value(parts.next()?)?,
            id: parse_value(parts.next()?)?,
        })
    }
}

/// Who lists: an org, or the operators (org ids are never empty).
fn lister(caller: &Caller) -> &str {
    caller.org_id.as_deref().unwrap_or("")
}

/// A value as text, tagged with its type; text last, so that it may hold anything.
fn value_text(value: &SqlValue) -> String {
    match value {
        SqlValue::Integer(n) => format!("i{n}"),
        SqlValue::Real(r) => format!("r{r}"),
        SqlValue::Text(t) => format!("t{t}"),
        SqlValue::Blob(b) => format!(
            "x{}",
            b.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        SqlValue::Null => "n".to_owned(),
    }
}

fn parse_value(text: &str) -> Option<SqlValue> {
    let (tag, rest) = text.split_at_checked(1)?;
    Some(match tag {
        "i" => SqlValue::Integer(rest.parse().ok()?),
        // Only a number a row can hold: SQLite stores no NaN, and libSQL's wire format
        // carries no infinity.
        "r" => SqlValue::Real(rest.parse().ok().filter(|r: &f64| r.is_finite())?),
        // Ids and creation times hold no line break: only the last part could, and the id
        // is the last part.
        "t" => SqlValue::Text(rest.to_owned()),
        "x" => SqlValue::Blob(from_hex(rest)?),
        "n" if rest.is_empty() => SqlValue::Null,
        _ => return None,
    })
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_resumes_only_its_own_listing() {
        let caller = Caller::operator("op-key");
        let listing = Listing::reservations("n1", &caller);
        let position = Position {
            created_at: SqlValue::Integer(1_800_000_000_000),
            id: SqlValue::Text("res-1\nodd".into()),
        };
        let cursor = listing.cursor(&position);
        assert_eq!(listing.position(&cursor), Some(position.clone()));
        assert_eq!(Listing::reservations("n2", &caller).position(&cursor), None);
        assert_eq!(Listing::operator_keys().position(&cursor), None);
        let damaged = Position {
            created_at: SqlValue::Blob(vec![0, 255]),
            id: SqlValue::Null,
        };
        assert_eq!(listing.position(&listing.cursor(&damaged)), Some(damaged));
        for junk in ["", "res-1", "zz", "0", &cursor[1..], &format!("{cursor}0")] {
            assert_eq!(listing.position(junk), None, "{junk:?}");
        }
        let real = Position {
            created_at: SqlValue::Real(1.5e12),
            id: SqlValue::Text("res-1".into()),
        };
        assert_eq!(listing.position(&listing.cursor(&real)), Some(real));
        for forged in ["NaN", "nan", "inf", "-inf", "infinity", "1e999"] {
            let cursor = hex(&format!("reservations n1 \nr{forged}\ntres-1"));
            assert_eq!(listing.position(&cursor), None, "{forged}");
        }
    }

    fn hex(text: &str) -> String {
        hex_of(text)
    }

    #[test]
    fn a_listing_by_key_resumes_only_from_its_own_cursors() {
        let org = Caller::operator("op-key");
        let nodes = Listing::nodes(&org);
        let cursor = nodes.cursor_after_key("node-7");
        assert_eq!(nodes.key(&cursor), Some("node-7".to_owned()));
        assert_eq!(Listing::vms(&org).key(&cursor), None);
        assert_eq!(Listing::market(&org).key(&cursor), None);
        let reservations = Listing::reservations("node-7", &org);
        let position = Position {
            created_at: SqlValue::Integer(1),
            id: SqlValue::Text("r".into()),
        };
        assert_eq!(nodes.key(&reservations.cursor(&position)), None);
        for junk in ["", "node-7", "zzz-not-a-cursor", "p12.3", &hex("nodes \n")] {
            assert_eq!(nodes.key(junk), None, "{junk:?}");
        }
    }
}
