//! Nodes and their GPU units. Changing a node's unit set moves its topology generation on
//! and withholds every reservation written against an older one for review.

use std::collections::BTreeSet;

use crate::storage::{SqlValue, StorageError};
use reservations_domain::access::{Decision, may_write_node};
use reservations_domain::ids::validate_ids;
use reservations_domain::reservation::{MAX_UNITS_PER_NODE, StoredState, Term, validate_unit_list};
use reservations_domain::topology::{needs_review, next_topology_gen};
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::rows::{Row, exec, first_row, for_chunks, millis, placeholders, rows, text};

use crate::tx::in_write_transaction;
use crate::{Context, Page, Result, Store};

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
}

const SUMMARY_COLUMNS: &str = "id, owner_org_id, topology_gen, unit_count, created_at, updated_at";

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

impl Store<'_> {
    pub fn node_summary(&self, id: &str) -> Result<Option<NodeSummary>> {
        let result = exec(
            self.db(),
            &format!("SELECT {SUMMARY_COLUMNS} FROM nodes WHERE id = ?"),
            &[text(id)],
        )?;
        Ok(first_row(&result).map(|r| read_summary(&r)).transpose()?)
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

    /// Which of `unit_ids` are units of the node.
    pub(crate) fn units_on_node(
        &self,
        node_id: &str,
        unit_ids: &[String],
    ) -> Result<BTreeSet<String>> {
        let found = self.units_where(
            "SELECT unit_id FROM node_units WHERE node_id = ? AND unit_id IN",
            node_id,
            unit_ids,
        )?;
        Ok(found.into_iter().collect())
    }

    /// The unit ids `select` (which takes the node id and ends in `unit_id IN`) returns for
    /// `unit_ids`, asked in chunks that fit SQLite's parameter limit.
    fn units_where(&self, select: &str, node_id: &str, unit_ids: &[String]) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for_chunks(unit_ids, 1, |part| {
            let mut params = vec![text(node_id)];
            params.extend(part.iter().map(|u| text(u)));
            let result = exec(
                self.db(),
                &format!("{select} ({})", placeholders(part.len())),
                &params,
            )?;
            for row in rows(&result) {
                found.push(row.text("unit_id")?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Nodes ordered by id; the cursor is the last id of the previous page.
    pub fn list_nodes(
        &self,
        owner_org_id: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<NodeSummary>> {
        let limit = limit.clamp(1, 500);
        let result = exec(
            self.db(),
            &format!(
                "SELECT {SUMMARY_COLUMNS} FROM nodes WHERE id > ? AND (?2 IS NULL OR owner_org_id = ?2) \
                 ORDER BY id LIMIT ?3"
            ),
            &[
                text(after.unwrap_or("")),
                owner_org_id.map(str::to_owned).into(),
                SqlValue::Integer(limit as i64 + 1),
            ],
        )?;
        let items = rows(&result)
            .map(|r| read_summary(&r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_overfetched(items, limit, |n| n.id.clone()))
    }

    /// Registers a node or replaces its owner and unit set.
    pub fn put_node(
        &self,
        ctx: &Context<'_>,
        id: &str,
        owner_org_id: &str,
        unit_ids: &[String],
    ) -> Result<NodeWrite> {
        validate_ids("unitIds", unit_ids)?;
        validate_unit_list("unitIds", unit_ids, MAX_UNITS_PER_NODE)?;
        in_write_transaction(self.db(), || {
            let existing = self.node_summary(id)?;
            match may_write_node(
                ctx.caller,
                existing.as_ref().map(|n| n.owner_org_id.as_str()),
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
            if self.get_org(owner_org_id)?.is_none() {
                return Err(DomainError::UnknownOrgs {
                    org_ids: vec![owner_org_id.to_owned()],
                }
                .into());
            }
            match existing {
                None => self.insert_node(ctx, id, owner_org_id, unit_ids),
                Some(summary) => self.update_node(ctx, summary, owner_org_id, unit_ids),
            }
        })
    }

    fn insert_node(
        &self,
        ctx: &Context<'_>,
        id: &str,
        owner_org_id: &str,
        unit_ids: &[String],
    ) -> Result<NodeWrite> {
        let summary = NodeSummary {
            id: id.to_owned(),
            owner_org_id: owner_org_id.to_owned(),
            topology_gen: 1,
            unit_count: unit_ids.len() as i64,
            created_at: ctx.now,
            updated_at: ctx.now,
        };
        exec(
            self.db(),
            &format!("INSERT INTO nodes ({SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"),
            &[
                text(id),
                text(owner_org_id),
                SqlValue::Integer(1),
                SqlValue::Integer(summary.unit_count),
                millis(ctx.now),
                millis(ctx.now),
            ],
        )?;
        self.insert_node_units(id, unit_ids.iter().enumerate())?;
        self.append_event(
            ctx,
            NewEvent {
                action: "node.create",
                node_id: Some(id),
                org_id: Some(owner_org_id),
                unit_ids,
                visible_to: vec![owner_org_id.to_owned()],
                ..NewEvent::default()
            },
        )?;
        Ok(NodeWrite {
            node: Node {
                summary,
                unit_ids: unit_ids.to_vec(),
            },
            created: true,
            withheld_reservation_ids: Vec::new(),
        })
    }

    fn insert_node_units<'u>(
        &self,
        node_id: &str,
        units: impl Iterator<Item = (usize, &'u String)>,
    ) -> Result<()> {
        let units: Vec<(usize, &String)> = units.collect();
        for_chunks(&units, 3, |part| {
            let mut params = Vec::with_capacity(part.len() * 3);
            for (position, unit) in part {
                params.extend([
                    text(node_id),
                    text(unit),
                    SqlValue::Integer(*position as i64),
                ]);
            }
            let values = vec!["(?, ?, ?)"; part.len()].join(", ");
            exec(
                self.db(),
                &format!("INSERT INTO node_units (node_id, unit_id, position) VALUES {values}"),
                &params,
            )?;
            Ok(())
        })?;
        Ok(())
    }

    fn update_node(
        &self,
        ctx: &Context<'_>,
        mut summary: NodeSummary,
        owner_org_id: &str,
        unit_ids: &[String],
    ) -> Result<NodeWrite> {
        let id = summary.id.clone();
        let old_units = self.node_unit_ids(&id)?;
        let old_set: BTreeSet<String> = old_units.iter().cloned().collect();
        let new_set: BTreeSet<String> = unit_ids.iter().cloned().collect();
        let removed: Vec<String> = old_set.difference(&new_set).cloned().collect();
        let added: Vec<&String> = unit_ids.iter().filter(|u| !old_set.contains(*u)).collect();
        let busy = self.units_running_vms(&id, &removed, ctx.now)?;
        if !busy.is_empty() {
            return Err(DomainError::UnitsInUse { unit_ids: busy }.into());
        }
        let new_gen = next_topology_gen(summary.topology_gen, &old_set, &new_set);
        for_chunks(&removed, 1, |part| {
            let mut params = vec![text(&id)];
            params.extend(part.iter().map(|u| text(u)));
            exec(
                self.db(),
                &format!(
                    "DELETE FROM node_units WHERE node_id = ? AND unit_id IN ({})",
                    placeholders(part.len())
                ),
                &params,
            )?;
            Ok(())
        })?;
        // Past the highest position in use: removals leave gaps, so the count could collide.
        let next_position = self.next_unit_position(&id)?;
        self.insert_node_units(
            &id,
            added
                .into_iter()
                .enumerate()
                .map(|(i, u)| (next_position + i, u)),
        )?;
        exec(
            self.db(),
            "UPDATE nodes SET owner_org_id = ?, topology_gen = ?, unit_count = ?, updated_at = ? WHERE id = ?",
            &[
                text(owner_org_id),
                SqlValue::Integer(new_gen),
                SqlValue::Integer(unit_ids.len() as i64),
                millis(ctx.now),
                text(&id),
            ],
        )?;
        let withheld = self.withhold_outdated_reservations(ctx, &id, new_gen)?;
        let previous_owner = std::mem::replace(&mut summary.owner_org_id, owner_org_id.to_owned());
        summary.topology_gen = new_gen;
        summary.unit_count = unit_ids.len() as i64;
        summary.updated_at = ctx.now;
        self.append_event(
            ctx,
            NewEvent {
                action: "node.update",
                node_id: Some(&id),
                org_id: Some(owner_org_id),
                unit_ids,
                skipped: &withheld,
                visible_to: vec![owner_org_id.to_owned(), previous_owner],
                ..NewEvent::default()
            },
        )?;
        let unit_ids = self.node_unit_ids(&id)?;
        Ok(NodeWrite {
            node: Node { summary, unit_ids },
            created: false,
            withheld_reservation_ids: withheld,
        })
    }

    fn next_unit_position(&self, node_id: &str) -> Result<usize> {
        let result = exec(
            self.db(),
            "SELECT COALESCE(MAX(position) + 1, 0) AS next_position FROM node_units WHERE node_id = ?",
            &[text(node_id)],
        )?;
        let next = first_row(&result)
            .map(|r| r.int("next_position"))
            .transpose()?;
        Ok(next.unwrap_or(0) as usize)
    }

    /// Units among `unit_ids` that run a VM at `now` (a VM whose notice ran out runs no more,
    /// though its row may still say so until a placement writes it down).
    fn units_running_vms(
        &self,
        node_id: &str,
        unit_ids: &[String],
        now: Timestamp,
    ) -> Result<Vec<String>> {
        let mut busy = self.units_where(
            &format!(
                "SELECT vu.unit_id AS unit_id FROM vm_units vu JOIN vms v ON v.id = vu.vm_id \
                 WHERE vu.node_id = ? AND vu.running = 1 \
                   AND (v.terminates_at IS NULL OR v.terminates_at > {}) AND vu.unit_id IN",
                now.timestamp_millis()
            ),
            node_id,
            unit_ids,
        )?;
        busy.sort();
        Ok(busy)
    }

    /// Marks `needs-review` every reservation of the node that the topology rule says must be.
    fn withhold_outdated_reservations(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        node_gen: i64,
    ) -> Result<Vec<String>> {
        let result = exec(
            self.db(),
            "SELECT id, starts_at, ends_at, topology_gen FROM reservations \
             WHERE node_id = ? AND state = 'live'",
            &[text(node_id)],
        )?;
        let mut withheld = Vec::new();
        for row in rows(&result) {
            let term = Term {
                starts_at: row.time("starts_at")?,
                ends_at: row.opt_time("ends_at")?,
            };
            let written_against = row.int("topology_gen")?;
            if needs_review(StoredState::Live, &term, written_against, node_gen, ctx.now) {
                withheld.push(row.text("id")?);
            }
        }
        for_chunks(&withheld, 1, |part| {
            let mut params = vec![millis(ctx.now)];
            params.extend(part.iter().map(|r| text(r)));
            exec(
                self.db(),
                &format!(
                    "UPDATE reservations SET state = 'needs-review', updated_at = ? WHERE id IN ({})",
                    placeholders(part.len())
                ),
                &params,
            )?;
            Ok(())
        })?;
        withheld.sort();
        Ok(withheld)
    }
}
