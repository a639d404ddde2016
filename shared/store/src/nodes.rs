//! Nodes and their GPU units. Changing a node's unit set moves its topology generation on
//! and withholds every reservation written against an older one for review.

use std::collections::BTreeSet;

use crate::storage::{SqlValue, StorageError};
use crate::write::Fact;
use reservations_domain::access::{Decision, may_read_node, may_write_node};
use reservations_domain::ids::validate_ids;
use reservations_domain::reservation::{MAX_UNITS_PER_NODE, StoredState, Term, UnitIds};
use reservations_domain::topology::{needs_review, next_topology_gen, units_in_use};
use reservations_domain::{DomainError, Timestamp};

use reservations_domain::time::from_millis;

use crate::audit::{Basis, NewEvent, basis_column, read_basis};
use crate::storage::{Row, exec, first_row, millis, read_listed, rows, text};
use crate::write::{Changes, NodeRow, Planned, ReservationState, Write, node_chain};
use crate::{Capacity, Context, Page, Result};

/// The most nodes one page of the listing holds.
pub const MAX_NODE_PAGE: usize = 500;

/// A node without its units, as listings show it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSummary {
    pub id: String,
    pub owner_org_id: String,
    pub topology_gen: i64,
    pub unit_count: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub summary: NodeSummary,
    pub unit_ids: Vec<String>,
}

/// What a PUT of a node did.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWrite {
    pub node: Node,
    pub created: bool,
    /// Reservations that the change withheld for review.
    pub withheld_reservation_ids: Vec<String>,
    /// How many of the node's units are for sale once the change is made, decided with the
    /// change itself: the answer reads nothing after the write, so a failure after it
    /// landed can never be answered as a change that did not happen.
    pub units_for_sale: i64,
}

const SUMMARY_COLUMNS: &str = "id, owner_org_id, topology_gen, unit_count, created_at, updated_at";

/// A node as the listing gives it: its summary and how many of its units are for sale.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedNode {
    pub summary: NodeSummary,
    pub released_idle_unit_count: i64,
}

fn read_summary(row: &Row<'_>) -> Result<NodeSummary, StorageError> {
    Ok(NodeSummary {
        id: row.text("id")?,
        owner_org_id: row.text("owner_org_id")?,
        topology_gen: row.int("topology_gen")?,
        unit_count: row.int("unit_count")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

impl Capacity<'_, '_> {
    pub fn node_summary(&self, id: &str) -> Result<Option<NodeSummary>> {
        let result = exec(
            self.db(),
            &format!("SELECT {SUMMARY_COLUMNS} FROM nodes WHERE id = ?"),
            &[text(id)],
        )?;
        Ok(first_row(&result).map(|r| read_summary(&r)).transpose()?)
    }

    /// A node and how many of its units are for sale now, for a caller who may read nodes.
    pub fn read_node(&self, ctx: &Context<'_>, id: &str) -> Result<(Node, i64)> {
        may_read_node(ctx.caller).enforce("node", "reading nodes needs node.read")?;
        let node = self
            .get_node(id)?
            .ok_or(DomainError::NotFound { what: "node" })?;
        Ok((node, self.market().units_for_sale(id, ctx.now)?))
    }

    pub fn get_node(&self, id: &str) -> Result<Option<Node>> {
        let Some(summary) = self.node_summary(id)? else {
            return Ok(None);
        };
        let unit_ids = self.node_unit_ids(id)?;
        Ok(Some(Node { summary, unit_ids }))
    }

    fn node_unit_ids(&self, id: &str) -> Result<Vec<String>> {
        let result = exec(
            self.db(),
            "SELECT unit_id FROM node_units WHERE node_id = ? ORDER BY position",
            &[text(id)],
        )?;
        Ok(rows(&result)
            .map(|r| r.text("unit_id"))
            .collect::<Result<_, _>>()?)
    }

    /// Nodes ordered by id, each with how many of its units are for sale at `now`; the
    /// cursor is the last id of the previous page.
    /// A page of nodes, optionally of one owner, for a caller who may read nodes.
    pub fn list_nodes(
        &self,
        ctx: &Context<'_>,
        owner_org_id: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ListedNode>> {
        may_read_node(ctx.caller).enforce("node", "reading nodes needs node.read")?;
        let now = ctx.now;
        let limit = limit.clamp(1, MAX_NODE_PAGE);
        let result = exec(
            self.db(),
            &format!(
                "SELECT {SUMMARY_COLUMNS}, {} FROM nodes \
                 WHERE id > ?1 AND (?2 IS NULL OR owner_org_id = ?2) ORDER BY id LIMIT ?3",
                crate::market::count_column(4)
            ),
            &[
                text(after.unwrap_or("")),
                owner_org_id.map(str::to_owned).into(),
                SqlValue::Integer(limit as i64 + 1),
                millis(now),
            ],
        )?;
        let listed = rows(&result)
            .map(|r| {
                read_listed(&r, "id", |r| {
                    Ok(ListedNode {
                        summary: read_summary(r)?,
                        released_idle_unit_count: r.int("released_idle_unit_count")?,
                    })
                })
            })
            .collect();
        Ok(Page::from_overfetched_rows(listed, limit, |n| {
            n.summary.id.clone()
        }))
    }

    /// Registers a node or replaces its owner and unit set.
    pub fn put_node(
        &self,
        ctx: &Context<'_>,
        id: &str,
        owner_org_id: &str,
        unit_ids: &[String],
    ) -> Result<NodeWrite> {
        self.carry_out(ctx, || self.plan_put_node(ctx, id, owner_org_id, unit_ids))
    }

    /// The plan of [`Capacity::put_node`] from fresh facts.
    pub fn plan_put_node(
        &self,
        ctx: &Context<'_>,
        id: &str,
        owner_org_id: &str,
        unit_ids: &[String],
    ) -> Result<Planned<NodeWrite>> {
        validate_ids("unitIds", unit_ids)?;
        UnitIds::check("unitIds", unit_ids, MAX_UNITS_PER_NODE)?;
        let facts = self.node_facts(id, owner_org_id, ctx.now)?;
        match may_write_node(
            ctx.caller,
            facts.node.as_ref().map(|n| n.owner_org_id.as_str()),
            owner_org_id,
        ) {
            Decision::Allow => {}
            Decision::NotFound => return Err(DomainError::NotFound { what: "node" }.into()),
            Decision::Forbidden => {
                return Err(DomainError::Forbidden(
                    "only operators register nodes or change their owner; the owner org may update its node's units with node.write".into(),
                )
                .into());
            }
        }
        if !facts.owner_exists {
            return Err(DomainError::UnknownOrgs {
                org_ids: vec![owner_org_id.to_owned()],
            }
            .into());
        }
        let basis = facts.basis.clone();
        let (outcome, event, changes) = match facts.node.clone() {
            None => plan_new_node(ctx, id, owner_org_id, unit_ids),
            Some(summary) => plan_node_update(ctx, summary, &facts, owner_org_id, unit_ids)?,
        };
        Ok(Planned {
            outcome,
            write: Some(Write::new(node_chain(id), basis, event, changes)),
        })
    }

    /// Everything a PUT of a node depends on, in one statement: the node, its units in order,
    /// the next free position, the units running VMs (with their deadlines), its live
    /// reservations (with their units), its units for sale at `now`, whether the owner org
    /// exists, and what the write is made on.
    fn node_facts(&self, id: &str, owner_org_id: &str, now: Timestamp) -> Result<NodeFacts> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT (SELECT 1 FROM orgs WHERE id = ?2) AS owner_exists, \
                 (SELECT json_array({SUMMARY_COLUMNS}) FROM nodes WHERE id = ?1) AS node, \
                 (SELECT json_group_array(unit_id) FROM \
                   (SELECT unit_id FROM node_units WHERE node_id = ?1 ORDER BY position)) AS units, \
                 (SELECT COALESCE(MAX(position) + 1, 0) FROM node_units WHERE node_id = ?1) \
                   AS next_position, \
                 (SELECT json_group_array(json_array(vu.unit_id, v.terminates_at)) \
                   FROM vm_units vu JOIN vms v ON v.id = vu.vm_id \
                   WHERE vu.node_id = ?1 AND vu.running = 1) AS running_units, \
                 (SELECT json_group_array(json_array(r.id, r.starts_at, r.ends_at, r.topology_gen, \
                   json((SELECT json_group_array(unit_id) FROM reservation_units \
                     WHERE reservation_id = r.id)))) \
                   FROM reservations r WHERE r.node_id = ?1 AND r.state = 'live') \
                   AS live_reservations, \
                 {}, {}",
                crate::market::for_sale_column(1, 4),
                // What an update reads: the node, every unit of it (its claims, releases and
                // VM), its reservations and the VMs running on it.
                basis_column(
                    "?3",
                    &format!(
                        "SELECT {} AS fact \
                         UNION ALL SELECT {} FROM node_units WHERE node_id = ?1 \
                         UNION ALL SELECT {} FROM reservations WHERE node_id = ?1 \
                         UNION ALL SELECT {} FROM vm_units WHERE node_id = ?1 AND running = 1",
                        Fact::node("?1"),
                        Fact::unit("?1", "unit_id"),
                        Fact::reservation("?1", "id"),
                        Fact::vm("?1", "vm_id"),
                    )
                )
            ),
            &[
                text(id),
                text(owner_org_id),
                text(&node_chain(id)),
                millis(now),
            ],
        )?;
        let row = first_row(&result)
            .ok_or_else(|| StorageError::Other("the node's facts returned no row".into()))?;
        type SummaryRow = (String, String, i64, i64, i64, i64);
        let node = row.opt_json::<SummaryRow>("node")?.map(
            |(id, owner_org_id, topology_gen, unit_count, created_at, updated_at)| NodeSummary {
                id,
                owner_org_id,
                topology_gen,
                unit_count,
                created_at: from_millis(created_at),
                updated_at: from_millis(updated_at),
            },
        );
        let owner_exists = match row.value("owner_exists")? {
            SqlValue::Null if self.directory.is_some() => !self
                .identity()
                .orgs_from_directory(&[owner_org_id.to_owned()])?
                .is_empty(),
            SqlValue::Null => false,
            _ => true,
        };
        Ok(NodeFacts {
            owner_exists,
            node,
            unit_ids: row.json("units")?,
            next_position: row.int("next_position")?,
            running_units: row.json("running_units")?,
            live_reservations: row.json("live_reservations")?,
            for_sale: row.json("for_sale")?,
            basis: read_basis(&row)?,
        })
    }
}

/// `[id, startsAt, endsAt, topologyGen, unitIds]` of one of the node's live reservations.
type LiveReservation = (String, i64, Option<i64>, i64, Vec<String>);

/// What [`Capacity::node_facts`] reads.
struct NodeFacts {
    owner_exists: bool,
    node: Option<NodeSummary>,
    unit_ids: Vec<String>,
    next_position: i64,
    /// `[unitId, terminatesAt]` of every running VM's unit on the node.
    running_units: Vec<(String, Option<i64>)>,
    live_reservations: Vec<LiveReservation>,
    /// `[unitId, reservationId]` of the node's units for sale now.
    for_sale: Vec<(String, String)>,
    basis: Basis,
}

fn plan_new_node(
    ctx: &Context<'_>,
    id: &str,
    owner_org_id: &str,
    unit_ids: &[String],
) -> (NodeWrite, NewEvent, Changes) {
    let now = from_millis(ctx.now.timestamp_millis());
    let summary = NodeSummary {
        id: id.to_owned(),
        owner_org_id: owner_org_id.to_owned(),
        topology_gen: 1,
        unit_count: unit_ids.len() as i64,
        created_at: now,
        updated_at: now,
    };
    let changes = Changes {
        new_node: Some(NodeRow {
            owner_org_id: owner_org_id.to_owned(),
            topology_gen: 1,
            unit_count: summary.unit_count,
        }),
        added_node_units: unit_ids
            .iter()
            .enumerate()
            .map(|(position, unit)| (unit.clone(), position as i64))
            .collect(),
        ..Changes::default()
    };
    let event = NewEvent {
        action: "node.create",
        node_id: Some(id.to_owned()),
        org_id: Some(owner_org_id.to_owned()),
        unit_ids: unit_ids.to_vec(),
        visible_to: vec![owner_org_id.to_owned()],
        ..NewEvent::default()
    };
    let outcome = NodeWrite {
        node: Node {
            summary,
            unit_ids: unit_ids.to_vec(),
        },
        created: true,
        withheld_reservation_ids: Vec::new(),
        // A new node has no reservations, so nothing of it is released.
        units_for_sale: 0,
    };
    (outcome, event, changes)
}

/// A new owner and unit set for a node: the units it loses must run no VM (one whose notice
/// ran out runs no more, though its row may still say so), and every live reservation that
/// the topology rule says must be is withheld for review.
fn plan_node_update(
    ctx: &Context<'_>,
    mut summary: NodeSummary,
    facts: &NodeFacts,
    owner_org_id: &str,
    unit_ids: &[String],
) -> Result<(NodeWrite, NewEvent, Changes)> {
    let old_set: BTreeSet<String> = facts.unit_ids.iter().cloned().collect();
    let new_set: BTreeSet<String> = unit_ids.iter().cloned().collect();
    let removed: Vec<String> = old_set.difference(&new_set).cloned().collect();
    let added: Vec<&String> = unit_ids.iter().filter(|u| !old_set.contains(*u)).collect();
    let running: Vec<(String, Option<Timestamp>)> = facts
        .running_units
        .iter()
        .map(|(unit, deadline)| (unit.clone(), deadline.map(from_millis)))
        .collect();
    let busy = units_in_use(&running, &removed.iter().cloned().collect(), ctx.now);
    if !busy.is_empty() {
        return Err(DomainError::UnitsInUse {
            unit_ids: busy.into_iter().collect(),
        }
        .into());
    }
    let new_gen = next_topology_gen(summary.topology_gen, &old_set, &new_set);
    let mut withheld: Vec<String> = facts
        .live_reservations
        .iter()
        .filter(|(_, starts_at, ends_at, written_against, _)| {
            let term = Term {
                starts_at: from_millis(*starts_at),
                ends_at: ends_at.map(from_millis),
            };
            needs_review(StoredState::Live, &term, *written_against, new_gen, ctx.now)
        })
        .map(|(id, ..)| id.clone())
        .collect();
    withheld.sort();
    // A unit stays for sale unless it leaves the node or a reservation withheld for review
    // holds it (its own, or another one of the unit).
    let withheld_units: BTreeSet<&String> = facts
        .live_reservations
        .iter()
        .filter(|(id, ..)| withheld.contains(id))
        .flat_map(|(.., units)| units)
        .collect();
    let units_for_sale = facts
        .for_sale
        .iter()
        .filter(|(unit, reservation)| {
            new_set.contains(unit)
                && !withheld.contains(reservation)
                && !withheld_units.contains(unit)
        })
        .count() as i64;
    // Past the highest position in use: removals leave gaps, so the count could collide.
    let added_node_units = added
        .into_iter()
        .enumerate()
        .map(|(i, unit)| (unit.clone(), facts.next_position + i as i64))
        .collect();
    let changes = Changes {
        node_update: Some(NodeRow {
            owner_org_id: owner_org_id.to_owned(),
            topology_gen: new_gen,
            unit_count: unit_ids.len() as i64,
        }),
        removed_node_units: removed.clone(),
        added_node_units,
        reservation_states: withheld
            .iter()
            .map(|id| ReservationState {
                id: id.clone(),
                state: "needs-review",
                topology_gen: None,
            })
            .collect(),
        touched_reservations: withheld.clone(),
        ..Changes::default()
    };
    let previous_owner = std::mem::replace(&mut summary.owner_org_id, owner_org_id.to_owned());
    summary.topology_gen = new_gen;
    summary.unit_count = unit_ids.len() as i64;
    summary.updated_at = from_millis(ctx.now.timestamp_millis());
    let event = NewEvent {
        action: "node.update",
        node_id: Some(summary.id.clone()),
        org_id: Some(owner_org_id.to_owned()),
        unit_ids: unit_ids.to_vec(),
        skipped: withheld.clone(),
        visible_to: vec![owner_org_id.to_owned(), previous_owner],
        ..NewEvent::default()
    };
    // The node's units in position order: those kept, then those added.
    let mut node_unit_ids: Vec<String> = facts
        .unit_ids
        .iter()
        .filter(|u| new_set.contains(*u))
        .cloned()
        .collect();
    node_unit_ids.extend(unit_ids.iter().filter(|u| !old_set.contains(*u)).cloned());
    let outcome = NodeWrite {
        node: Node {
            summary,
            unit_ids: node_unit_ids,
        },
        created: false,
        withheld_reservation_ids: withheld,
        units_for_sale,
    };
    Ok((outcome, event, changes))
}
