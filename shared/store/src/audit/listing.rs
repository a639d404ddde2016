//! Listing the trail: the events a filter picks, oldest first, a page at a time, for an
//! operator or within what an org may see, and the events feed's actions.

use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, may_read_audit};

use super::event::{AuditEvent, COLUMNS, TRAIL_CHAIN, read_event};
use crate::storage::SqlValue;
use crate::storage::{exec, millis, placeholders, rows, text};
use crate::write::NODE_CHAIN_PREFIX;
use crate::{Page, Result, Trail};

/// The most events one page of the trail holds.
pub const MAX_AUDIT_PAGE: usize = 1000;

/// Which events to list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub node_id: Option<String>,
    pub reservation_id: Option<String>,
    pub action: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
    /// Only events this org sees something of (see [`reservations_domain::audit`]); `None`
    /// for operators. With a `reservation_id` filter, only those it is a principal of: an
    /// affected VM owner must not learn a reservation's id from its events.
    pub visible_to_org: Option<String>,
    /// List events after this sequence number.
    pub after_seq: Option<i64>,
    /// List events up to this sequence number (the feed reads the head first).
    pub up_to_seq: Option<i64>,
    /// Only these actions (empty: all; `action` narrows further).
    pub actions: &'static [&'static str],
    pub limit: usize,
}

/// The actions the events feed (`GET /v1/events`) carries: what happens to capacity and to
/// VMs on it.
pub const FEED_ACTIONS: &[&str] = &[
    "reservation.release",
    "reservation.reclaim",
    "vm.place",
    "vm.terminate",
];

/// One row of a listing: an event, or a row damaged so that it cannot be read (listed by its
/// sequence number so that the listing goes on; `verify` says what is wrong with it).
#[derive(Debug, Clone, PartialEq)]
pub enum Listed {
    Event(Box<AuditEvent>),
    Unreadable { seq: i64, error: String },
}

impl Listed {
    pub fn seq(&self) -> i64 {
        match self {
            Listed::Event(event) => event.seq,
            Listed::Unreadable { seq, .. } => *seq,
        }
    }
}

impl Trail<'_, '_> {
    /// [`Trail::list_audit`] for a caller who may read the audit trail, within what its
    /// org may see.
    pub fn read_audit(&self, caller: &Caller, filter: AuditFilter) -> Result<Page<Listed>> {
        may_read_audit(caller)
            .enforce("audit trail", "reading the audit trail needs audit.read")?;
        self.list_audit(&AuditFilter {
            visible_to_org: caller.org_id.clone(),
            ..filter
        })
    }

    /// Events matching `filter`, oldest first, one page at a time. An org's listing walks
    /// only the events it may see (`audit_visibility`, from its cursor on), so its first page
    /// costs what a resumed one does, however many events other orgs have. An operator's
    /// listing of a node's or a reservation's events walks the node's chain from its cursor
    /// on (every event about a node, its reservations and its VMs is in it), and the node's
    /// events from before it had a chain (in `trail`, by `audit_trail_by_node`).
    pub fn list_audit(&self, filter: &AuditFilter) -> Result<Page<Listed>> {
        let after = SqlValue::Integer(filter.after_seq.unwrap_or(0));
        let limit = filter.limit.clamp(1, MAX_AUDIT_PAGE);
        let overfetch = SqlValue::Integer(limit as i64 + 1);
        let narrowing = Narrowing::of(filter);
        let (sql, params) = match (&filter.visible_to_org, node_of(filter)) {
            (None, Some((node, node_params))) => {
                let chain = format!("'{NODE_CHAIN_PREFIX}' || {node}");
                let in_chain = format!(
                    "e.chain = {chain} AND e.seq > ? AND e.chain_seq > COALESCE(\
                     (SELECT c.chain_seq FROM audit_events c WHERE c.seq = ? AND c.chain = {chain}), 0)"
                );
                // In the order of the statement's parameters: the part in `trail`, the
                // part in the chain, the page.
                let mut params = node_params.clone();
                params.push(after.clone());
                params.extend(narrowing.params.iter().cloned());
                params.push(overfetch.clone());
                params.extend(node_params.iter().cloned());
                params.extend([after.clone(), after]);
                params.extend(node_params);
                params.extend(narrowing.params);
                params.extend([overfetch.clone(), overfetch]);
                // Each part stops at a page; the page is the first of the two merged.
                (
                    format!(
                        "SELECT {COLUMNS} FROM (\
                           SELECT * FROM (SELECT e.* FROM audit_events e INDEXED BY audit_trail_by_node \
                             WHERE e.chain = '{TRAIL_CHAIN}' AND e.node_id = {node} AND e.seq > ?{} \
                             ORDER BY e.seq LIMIT ?) \
                           UNION ALL \
                           SELECT * FROM (SELECT e.* FROM audit_events e INDEXED BY audit_by_place \
                             WHERE {in_chain}{} ORDER BY e.chain_seq LIMIT ?)\
                         ) e ORDER BY e.seq LIMIT ?",
                        narrowing.sql, narrowing.sql
                    ),
                    params,
                )
            }
            (None, None) => {
                let mut params = vec![after];
                params.extend(narrowing.params);
                params.push(overfetch);
                (
                    format!(
                        "SELECT {COLUMNS} FROM audit_events e WHERE e.seq > ?{} \
                         ORDER BY e.seq LIMIT ?",
                        narrowing.sql
                    ),
                    params,
                )
            }
            (Some(org), _) => {
                // An affected VM owner must not learn a reservation's id from its events.
                let full_view = match filter.reservation_id {
                    Some(_) => " AND v.full_view = 1",
                    None => "",
                };
                let mut params = vec![text(org), after];
                if let Some(node) = &filter.node_id {
                    params.push(text(node));
                }
                params.extend(narrowing.params);
                params.push(overfetch);
                (
                    format!(
                        "SELECT {COLUMNS} FROM audit_visibility v CROSS JOIN audit_events e \
                         ON e.seq = v.seq WHERE v.org_id = ? AND v.seq > ?{full_view}{}{} \
                         ORDER BY e.seq LIMIT ?",
                        match filter.node_id {
                            Some(_) => " AND e.node_id = ?",
                            None => "",
                        },
                        narrowing.sql
                    ),
                    params,
                )
            }
        };
        let result = exec(self.db(), &sql, &params)?;
        let items = rows(&result)
            .map(|row| {
                let seq = row.int("seq").unwrap_or_default();
                match read_event(row) {
                    Ok(event) => Listed::Event(Box::new(event)),
                    Err(e) => Listed::Unreadable {
                        seq,
                        error: e.to_string(),
                    },
                }
            })
            .collect();
        Ok(Page::from_overfetched(items, limit, |listed| {
            listed.seq().to_string()
        }))
    }
}

/// The node whose chain an operator's listing walks: the node filtered by, or the
/// reservation's (an SQL expression, with its parameters).
fn node_of(filter: &AuditFilter) -> Option<(&'static str, Vec<SqlValue>)> {
    match (&filter.node_id, &filter.reservation_id) {
        (Some(node), _) => Some(("?", vec![text(node)])),
        (None, Some(reservation)) => Some((
            "(SELECT node_id FROM reservations WHERE id = ?)",
            vec![text(reservation)],
        )),
        (None, None) => None,
    }
}

/// The conditions of a listing besides whose events and where it resumes: ` AND …` on the
/// events `e`, with their parameters in order.
struct Narrowing {
    sql: String,
    params: Vec<SqlValue>,
}

impl Narrowing {
    fn of(filter: &AuditFilter) -> Narrowing {
        let mut narrowing = Narrowing {
            sql: String::new(),
            params: Vec::new(),
        };
        let mut add = |condition: &str, value: SqlValue| {
            narrowing.sql.push_str(" AND ");
            narrowing.sql.push_str(condition);
            narrowing.params.push(value);
        };
        if let Some(reservation) = &filter.reservation_id {
            add("e.reservation_id = ?", text(reservation));
        }
        if let Some(action) = &filter.action {
            add("e.action = ?", text(action));
        }
        if let Some(up_to) = filter.up_to_seq {
            add("e.seq <= ?", SqlValue::Integer(up_to));
        }
        if let Some(since) = filter.since {
            add("e.at >= ?", millis(since));
        }
        if let Some(until) = filter.until {
            add("e.at < ?", millis(until));
        }
        if !filter.actions.is_empty() {
            narrowing.sql.push_str(&format!(
                " AND e.action IN ({})",
                placeholders(filter.actions.len())
            ));
            narrowing
                .params
                .extend(filter.actions.iter().map(|a| text(a)));
        }
        narrowing
    }
}
