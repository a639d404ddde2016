//! The spot market: the released, idle units of active reservations, read through the
//! partial index `reservation_units_on_market` (schema 10), which holds only the released
//! units of live reservations whose release and term have not run out as of the last write,
//! so that a page costs O(units it lists), never O(units of the node), O(all reservations)
//! or O(units released by reservations since cancelled or ended).

use crate::storage::{SqlValue, StorageError};
use reservations_domain::Timestamp;
use reservations_domain::market::{Offer, ReleasedUnit, cursor_of, may_read_market, offer};
use reservations_domain::reservation::{StoredState, Term, derive_status};

use crate::storage::{Row, exec, first_row, millis, rows, text};

use crate::{Context, Market, Page, Result, UnreadableRow};

/// The columns of a candidate (`ru` a released unit, `r` its reservation) and the conditions
/// that make it one: the reservation is live and inside its term at `?now`, no VM runs on the
/// unit, and no `needs-review` reservation withholds it. The domain's [`offer`] decides again
/// on the row's facts, so the SQL is only ever a pre-filter of the rule.
///
/// `CROSS JOIN` fixes the join order whatever the statistics say: the released units are
/// walked in index order from the cursor (no sort, so `LIMIT` stops the walk), each joined to
/// its reservation by primary key; a unit's running VM is one probe of the one-VM-per-unit
/// index, and the needs-review check one probe of a partial index that is almost always
/// empty for the node.
const CANDIDATE_COLUMNS: &str =
    "ru.node_id, ru.unit_id, r.state, r.starts_at, r.ends_at, ru.released_until";
const RELEASED_UNITS: &str = "reservation_units ru INDEXED BY reservation_units_on_market \
     CROSS JOIN reservations r ON r.id = ru.reservation_id";
const FOR_SALE: &str = "ru.on_market = 1 AND ru.released = 1 AND (ru.released_until IS NULL OR ru.released_until > :now) \
     AND r.state = 'live' \
     AND r.starts_at <= :now AND (r.ends_at IS NULL OR r.ends_at > :now) \
     AND NOT EXISTS (SELECT 1 FROM vm_units v JOIN vms vm ON vm.id = v.vm_id \
         WHERE v.node_id = ru.node_id AND v.unit_id = ru.unit_id AND v.running = 1 \
           AND (vm.terminates_at IS NULL OR vm.terminates_at > :now)) \
     AND NOT EXISTS (SELECT 1 FROM reservations rw INDEXED BY reservations_needs_review \
         CROSS JOIN reservation_units w ON w.reservation_id = rw.id AND w.unit_id = ru.unit_id \
         WHERE rw.node_id = ru.node_id AND rw.state = 'needs-review')";

/// The listing's statement: parameters `?1`, `?2` (the node and unit after which to start;
/// with a node filter, the node and the unit on it), `?3` now, `?4` the row limit.
pub fn listing_sql(one_node: bool) -> String {
    let range = if one_node {
        "ru.node_id = ?1 AND ru.unit_id > ?2"
    } else {
        "(ru.node_id, ru.unit_id) > (?1, ?2)"
    };
    format!(
        "SELECT {CANDIDATE_COLUMNS} FROM {RELEASED_UNITS} \
         WHERE {range} AND {} ORDER BY ru.node_id, ru.unit_id LIMIT ?4",
        with_now(FOR_SALE, 3)
    )
}

/// Counts a node's units for sale: `?1` the node, `?2` now.
pub fn count_sql() -> String {
    format!(
        "SELECT COUNT(*) AS units_for_sale FROM {RELEASED_UNITS} WHERE ru.node_id = ?1 AND {}",
        with_now(FOR_SALE, 2)
    )
}

/// A column `for_sale`: the units of node `?{node_param}` for sale at `?{now_param}`, as a
/// JSON array of `[unitId, reservationId]`.
pub fn for_sale_column(node_param: usize, now_param: usize) -> String {
    format!(
        "(SELECT json_group_array(json_array(ru.unit_id, ru.reservation_id)) FROM {RELEASED_UNITS} \
         WHERE ru.node_id = ?{node_param} AND {}) AS for_sale",
        with_now(FOR_SALE, now_param)
    )
}

/// A column `released_idle_unit_count`: how many units of the node `nodes.id` are for sale
/// at the statement's parameter `?{now_param}`.
pub fn count_column(now_param: usize) -> String {
    format!(
        "(SELECT COUNT(*) FROM {RELEASED_UNITS} WHERE ru.node_id = nodes.id AND {}) \
         AS released_idle_unit_count",
        with_now(FOR_SALE, now_param)
    )
}

fn read_candidate(row: &Row<'_>, now: Timestamp) -> Result<ReleasedUnit, StorageError> {
    let stored = row.parsed("state", "reservation state", StoredState::parse)?;
    let term = Term {
        starts_at: row.time("starts_at")?,
        ends_at: row.opt_time("ends_at")?,
    };
    Ok(ReleasedUnit {
        node_id: row.text("node_id")?,
        unit_id: row.text("unit_id")?,
        status: derive_status(stored, &term, now),
        term,
        released_until: row.opt_time("released_until")?,
        // Both filtered out by the query.
        running_vm: false,
        withheld: false,
    })
}

/// Replaces the named `:now` parameter by a positional one (the `Sql` trait binds by
/// position), so the rule is written once.
fn with_now(sql: &str, now_param: usize) -> String {
    sql.replace(":now", &format!("?{now_param}"))
}

impl Market<'_, '_> {
    /// [`Market::offers`] now, for a caller who may read the market.
    pub fn read_market(
        &self,
        ctx: &Context<'_>,
        node_id: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Page<Offer>> {
        may_read_market(ctx.caller).enforce("market", "reading the market needs node.read")?;
        self.offers(node_id, after, limit, ctx.now)
    }

    /// Units for sale at `now`, ordered by node id then unit id, optionally on one node;
    /// `after` is the previous page's last `(nodeId, unitId)`.
    pub fn offers(
        &self,
        node_id: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
        now: Timestamp,
    ) -> Result<Page<Offer>> {
        let limit = limit.clamp(1, reservations_domain::market::MAX_PAGE);
        let (after_node, after_unit) = after.unwrap_or(("", ""));
        let mut params = match node_id {
            Some(node) => {
                let after_unit = if after_node == node {
                    after_unit
                } else if after_node > node {
                    // The cursor is past this node: nothing is left.
                    return Ok(Page::empty());
                } else {
                    ""
                };
                vec![text(node), text(after_unit)]
            }
            None => vec![text(after_node), text(after_unit)],
        };
        params.push(millis(now));
        params.push(SqlValue::Integer(limit as i64 + 1));
        let sql = listing_sql(node_id.is_some());
        let result = exec(self.db(), &sql, &params)?;
        let mut listed = Vec::new();
        for row in rows(&result) {
            match read_candidate(&row, now) {
                Ok(candidate) => listed.extend(offer(&candidate).map(Ok)),
                Err(e) => listed.push(Err(UnreadableRow {
                    key: cursor_of(
                        &row.text("node_id").unwrap_or_default(),
                        &row.text("unit_id").unwrap_or_default(),
                    ),
                    error: e.to_string(),
                })),
            }
        }
        Ok(Page::from_overfetched_rows(listed, limit, |o| {
            cursor_of(&o.node_id, &o.unit_id)
        }))
    }

    /// How many units of a node are for sale at `now` (O(released units of the node)).
    pub fn units_for_sale(&self, node_id: &str, now: Timestamp) -> Result<i64> {
        let sql = count_sql();
        let result = exec(self.db(), &sql, &[text(node_id), millis(now)])?;
        Ok(first_row(&result)
            .map(|r| r.int("units_for_sale"))
            .transpose()?
            .unwrap_or(0))
    }
}
