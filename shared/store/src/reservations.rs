//! Reservations: create, read, list, cancel, re-affirm.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::{SqlValue, StorageError};
use reservations_domain::access::{
    Decision, ReservationParties, may_list_reservations, may_read_reservation,
    may_reaffirm_reservation, may_write_reservation,
};
use reservations_domain::ids::validate_ids;
use reservations_domain::notice::released_at;
use reservations_domain::reservation::{
    ExistingClaim, NewReservation, Reservation, ReservationContext, Status, StoredState, Term,
    validate_reservation,
};
use reservations_domain::time::from_millis;
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::rows::{Row, exec, first_row, for_chunks, json_list, millis, placeholders, rows, text};

use crate::tx::in_write_transaction;
use crate::{Context, Page, Result, Store};

/// A reservation without its unit lists, plus its node's owner: everything authorization and
/// status need, at a cost independent of the reservation's size.
#[derive(Debug, Clone, PartialEq)]
pub struct ReservationHeader {
    pub id: String,
    pub node_id: String,
    pub node_owner: String,
    pub node_topology_gen: i64,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Vec<String>,
    pub term: Term,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
    pub topology_gen: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub stored_state: StoredState,
}

impl ReservationHeader {
    pub fn parties(&self) -> ReservationParties<'_> {
        ReservationParties {
            node_owner: &self.node_owner,
            allowed_org_ids: &self.allowed_org_ids,
            managing_org_ids: &self.managing_org_ids,
        }
    }

    pub fn status(&self, now: Timestamp) -> Status {
        reservations_domain::reservation::derive_status(self.stored_state, &self.term, now)
    }

    /// The reservation with empty unit lists, for representations that leave them out.
    pub fn without_unit_lists(self) -> Reservation {
        self.into_reservation(Vec::new(), Vec::new())
    }

    /// The reservation with its units (in the order they were reserved), released as the
    /// clock sees them at `now`: a timed release that ended has given its units back.
    pub fn with_units(self, units: Vec<ReservedUnit>, now: Timestamp) -> Reservation {
        let mut released_until = BTreeMap::new();
        let released = units
            .iter()
            .filter(|u| released_at(u.released, u.released_until, now))
            .map(|u| {
                if let Some(until) = u.released_until {
                    released_until.insert(u.unit_id.clone(), until);
                }
                u.unit_id.clone()
            })
            .collect();
        let reserved = units.into_iter().map(|u| u.unit_id).collect();
        let mut reservation = self.into_reservation(reserved, released);
        reservation.released_until = released_until;
        reservation
    }

    fn into_reservation(
        self,
        reserved_unit_ids: Vec<String>,
        released_unit_ids: Vec<String>,
    ) -> Reservation {
        Reservation {
            id: self.id,
            node_id: self.node_id,
            reserved_unit_ids,
            allowed_org_ids: self.allowed_org_ids,
            managing_org_ids: self.managing_org_ids,
            term: self.term,
            contract_ref: self.contract_ref,
            reason: self.reason,
            released_unit_ids,
            released_until: BTreeMap::new(),
            topology_gen: self.topology_gen,
            created_at: self.created_at,
            updated_at: self.updated_at,
            stored_state: self.stored_state,
        }
    }
}

/// The columns of a [`ReservationHeader`], from `reservations r JOIN nodes n`.
pub(crate) const HEADER_COLUMNS: &str = "r.id AS id, r.node_id AS node_id, \
     n.owner_org_id AS node_owner, n.topology_gen AS node_topology_gen, \
     r.allowed_org_ids AS allowed_org_ids, r.managing_org_ids AS managing_org_ids, \
     r.starts_at AS starts_at, r.ends_at AS ends_at, r.contract_ref AS contract_ref, \
     r.reason AS reason, r.topology_gen AS topology_gen, r.created_at AS created_at, \
     r.updated_at AS updated_at, r.state AS state";

/// A column `units` of the reservation `r`: its units in the order they were reserved, each
/// as `[unitId, released, releasedUntil]` (the last `null` unless the release is timed).
pub(crate) const UNITS_COLUMN: &str = "(SELECT json_group_array(json_array(unit_id, released, released_until)) \
     FROM (SELECT unit_id, released, released_until FROM reservation_units WHERE reservation_id = r.id \
     ORDER BY position)) AS units";

pub(crate) fn read_header(row: &Row<'_>) -> Result<ReservationHeader, StorageError> {
    Ok(ReservationHeader {
        id: row.text("id")?,
        node_id: row.text("node_id")?,
        node_owner: row.text("node_owner")?,
        node_topology_gen: row.int("node_topology_gen")?,
        allowed_org_ids: row.string_list("allowed_org_ids")?,
        managing_org_ids: row.string_list("managing_org_ids")?,
        term: Term {
            starts_at: row.time("starts_at")?,
            ends_at: row.opt_time("ends_at")?,
        },
        contract_ref: row.opt_text("contract_ref")?,
        reason: row.opt_text("reason")?,
        topology_gen: row.int("topology_gen")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
        stored_state: row.parsed("state", "reservation state", StoredState::parse)?,
    })
}

/// The reservation's units, from [`UNITS_COLUMN`].
pub(crate) fn read_units(row: &Row<'_>) -> Result<Vec<ReservedUnit>, StorageError> {
    let units: Vec<(String, i64, Option<i64>)> = row.json("units")?;
    Ok(units
        .into_iter()
        .map(|(unit_id, released, until)| ReservedUnit {
            unit_id,
            released: released != 0,
            released_until: until.map(from_millis),
        })
        .collect())
}

/// One unit of a reservation.
#[derive(Debug, Clone, PartialEq)]
pub struct ReservedUnit {
    pub unit_id: String,
    /// The stored flag; whether the unit is released now also depends on `released_until`.
    pub released: bool,
    pub released_until: Option<Timestamp>,
}

/// Turns a domain decision into the store's refusal.
pub(crate) fn enforce(
    decision: Decision,
    what: &'static str,
    forbidden: &'static str,
) -> Result<()> {
    Ok(decision.enforce(what, forbidden)?)
}

/// Which reservations to list.
#[derive(Debug, Clone, Default)]
pub struct ReservationFilter {
    pub statuses: Vec<Status>,
    /// The id of the last reservation of the previous page.
    pub after: Option<String>,
    pub limit: usize,
}

impl Store<'_> {
    pub fn reservation_header(&self, node_id: &str, id: &str) -> Result<Option<ReservationHeader>> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT {HEADER_COLUMNS} FROM reservations r JOIN nodes n ON n.id = r.node_id \
                 WHERE r.id = ? AND r.node_id = ?"
            ),
            &[text(id), text(node_id)],
        )?;
        Ok(first_row(&result).map(|r| read_header(&r)).transpose()?)
    }

    /// A reservation's header and units, read by one statement.
    fn header_and_units(
        &self,
        node_id: &str,
        id: &str,
    ) -> Result<Option<(ReservationHeader, Vec<ReservedUnit>)>> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT {HEADER_COLUMNS}, {UNITS_COLUMN} \
                 FROM reservations r JOIN nodes n ON n.id = r.node_id \
                 WHERE r.id = ? AND r.node_id = ?"
            ),
            &[text(id), text(node_id)],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        Ok(Some((read_header(&row)?, read_units(&row)?)))
    }

    /// The reservation as it now stands, inside the transaction that just changed it.
    fn reload_reservation(&self, node_id: &str, id: &str, now: Timestamp) -> Result<Reservation> {
        let (header, units) = self
            .header_and_units(node_id, id)?
            .ok_or(DomainError::NotFound {
                what: "reservation",
            })?;
        Ok(header.with_units(units, now))
    }

    /// The reservation with its unit lists (in the order they were reserved).
    pub(crate) fn load_reservation(
        &self,
        header: ReservationHeader,
        now: Timestamp,
    ) -> Result<Reservation> {
        let result = exec(
            self.db(),
            "SELECT unit_id, released, released_until FROM reservation_units WHERE reservation_id = ? ORDER BY position",
            &[text(&header.id)],
        )?;
        let units = rows(&result)
            .map(|row| {
                Ok(ReservedUnit {
                    unit_id: row.text("unit_id")?,
                    released: row.bool("released")?,
                    released_until: row.opt_time("released_until")?,
                })
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        Ok(header.with_units(units, now))
    }

    /// A reservation the caller may read, or `NotFound` / `Forbidden`.
    pub fn read_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
    ) -> Result<Reservation> {
        let (header, units) = self
            .header_and_units(node_id, id)?
            .ok_or(DomainError::NotFound {
                what: "reservation",
            })?;
        enforce(
            may_read_reservation(ctx.caller, header.parties()),
            "reservation",
            "reading reservations needs reservation.read",
        )?;
        Ok(header.with_units(units, ctx.now))
    }

    /// The node's reservations the caller may read, oldest first.
    pub fn list_reservations(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        filter: &ReservationFilter,
    ) -> Result<Page<Reservation>> {
        enforce(
            may_list_reservations(ctx.caller),
            "node",
            "listing reservations needs reservation.read",
        )?;
        if self.node_summary(node_id)?.is_none() {
            return Err(DomainError::NotFound { what: "node" }.into());
        }
        let limit = filter.limit.clamp(1, 100);
        let mut matches: Vec<ReservationHeader> = Vec::new();
        let mut after = filter.after.clone();
        // Visibility and clock-derived statuses are decided per row by the domain, so read in
        // batches until one more than a page has matched (that one says a next page exists).
        while matches.len() <= limit {
            let result = match &after {
                None => exec(
                    self.db(),
                    &format!(
                        "SELECT {HEADER_COLUMNS} FROM reservations r JOIN nodes n ON n.id = r.node_id \
                         WHERE r.node_id = ? ORDER BY r.created_at, r.id LIMIT 200"
                    ),
                    &[text(node_id)],
                )?,
                Some(after) => exec(
                    self.db(),
                    &format!(
                        "SELECT {HEADER_COLUMNS} FROM reservations r JOIN nodes n ON n.id = r.node_id \
                         WHERE r.node_id = ?1 AND (r.created_at, r.id) > \
                           (SELECT created_at, id FROM reservations WHERE id = ?2) \
                         ORDER BY r.created_at, r.id LIMIT 200"
                    ),
                    &[text(node_id), text(after)],
                )?,
            };
            if result.rows.is_empty() {
                break;
            }
            for row in rows(&result) {
                let header = read_header(&row)?;
                after = Some(header.id.clone());
                let wanted =
                    filter.statuses.is_empty() || filter.statuses.contains(&header.status(ctx.now));
                if wanted && may_read_reservation(ctx.caller, header.parties()).is_allowed() {
                    matches.push(header);
                }
            }
        }
        let page = Page::from_overfetched(matches, limit, |h| h.id.clone());
        let items = page
            .items
            .into_iter()
            .map(|h| self.load_reservation(h, ctx.now))
            .collect::<Result<Vec<_>>>()?;
        Ok(Page {
            items,
            next_cursor: page.next_cursor,
        })
    }

    /// Creates a reservation on a node: operators and the node's owner org.
    pub fn create_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        request: &NewReservation,
    ) -> Result<Reservation> {
        validate_ids("reservedUnitIds", &request.reserved_unit_ids)?;
        validate_ids("allowedOrgIds", &request.allowed_org_ids)?;
        validate_ids("managingOrgIds", &request.managing_org_ids)?;
        in_write_transaction(self.db(), || {
            let node = self
                .node_summary(node_id)?
                .ok_or(DomainError::NotFound { what: "node" })?;
            enforce(
                may_write_reservation(ctx.caller, &node.owner_org_id),
                "node",
                "creating reservations needs reservation.write",
            )?;
            self.check_reservation(node_id, None, request)?;
            exec(
                self.db(),
                "INSERT INTO reservations (id, node_id, state, starts_at, ends_at, allowed_org_ids, \
                 managing_org_ids, contract_ref, reason, topology_gen, created_at, updated_at) \
                 VALUES (?, ?, 'live', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                &[
                    text(id),
                    text(node_id),
                    millis(request.term.starts_at),
                    request.term.ends_at.map(|t| t.timestamp_millis()).into(),
                    json_list(&request.allowed_org_ids),
                    json_list(&request.managing_org_ids),
                    request.contract_ref.clone().into(),
                    request.reason.clone().into(),
                    SqlValue::Integer(node.topology_gen),
                    millis(ctx.now),
                    millis(ctx.now),
                ],
            )?;
            self.insert_reservation_units(
                id,
                node_id,
                &request.reserved_unit_ids,
                &BTreeSet::new(),
            )?;
            let mut visible_to = vec![node.owner_org_id.clone()];
            visible_to.extend(request.managing_org_ids.iter().cloned());
            visible_to.extend(request.allowed_org_ids.iter().cloned());
            self.append_event(
                ctx,
                NewEvent {
                    action: "reservation.create",
                    node_id: Some(node_id),
                    reservation_id: Some(id),
                    unit_ids: &request.reserved_unit_ids,
                    reason: request.reason.as_deref(),
                    visible_to,
                    ..NewEvent::default()
                },
            )?;
            self.reload_reservation(node_id, id, ctx.now)
        })
    }

    /// Checks a reservation's units against the node and the other reservations on it.
    fn check_reservation(
        &self,
        node_id: &str,
        except_reservation: Option<&str>,
        request: &NewReservation,
    ) -> Result<()> {
        // Cheap list checks first, so a huge bad list costs no queries.
        reservations_domain::reservation::validate_unit_list(
            "reservedUnitIds",
            &request.reserved_unit_ids,
            reservations_domain::reservation::MAX_UNITS_PER_NODE,
        )?;
        let node_unit_ids = self.units_on_node(node_id, &request.reserved_unit_ids)?;
        let mut named_orgs: Vec<String> = request.allowed_org_ids.clone();
        named_orgs.extend(request.managing_org_ids.iter().cloned());
        let known_org_ids = self.existing_org_ids(&named_orgs)?;
        let claims =
            self.claims_on_units(node_id, &request.reserved_unit_ids, except_reservation)?;
        validate_reservation(
            request,
            &ReservationContext {
                node_unit_ids: &node_unit_ids,
                known_org_ids: &known_org_ids,
                claims: &claims,
            },
        )?;
        Ok(())
    }

    /// Other non-cancelled reservations holding any of `unit_ids`, with the units they share.
    fn claims_on_units(
        &self,
        node_id: &str,
        unit_ids: &[String],
        except_reservation: Option<&str>,
    ) -> Result<Vec<ExistingClaim>> {
        let mut claims: BTreeMap<String, ExistingClaim> = BTreeMap::new();
        for_chunks(unit_ids, 1, |part| {
            let mut params = vec![text(node_id), text(except_reservation.unwrap_or(""))];
            params.extend(part.iter().map(|u| text(u)));
            let result = exec(
                self.db(),
                &format!(
                    "SELECT r.id, r.starts_at, r.ends_at, r.state, ru.unit_id \
                     FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id \
                     WHERE ru.node_id = ? AND r.state <> 'cancelled' AND r.id <> ? AND ru.unit_id IN ({})",
                    placeholders(part.len())
                ),
                &params,
            )?;
            for row in rows(&result) {
                let id = row.text("id")?;
                let state = row.text("state")?;
                let claim = match claims.get_mut(&id) {
                    Some(claim) => claim,
                    None => claims.entry(id.clone()).or_insert(ExistingClaim {
                        reservation_id: id,
                        unit_ids: Vec::new(),
                        term: Term {
                            starts_at: row.time("starts_at")?,
                            ends_at: row.opt_time("ends_at")?,
                        },
                        stored_state: StoredState::parse(&state).unwrap_or(StoredState::Live),
                    }),
                };
                claim.unit_ids.push(row.text("unit_id")?);
            }
            Ok(())
        })?;
        Ok(claims.into_values().collect())
    }

    fn insert_reservation_units(
        &self,
        reservation_id: &str,
        node_id: &str,
        unit_ids: &[String],
        released: &BTreeSet<String>,
    ) -> Result<()> {
        let positioned: Vec<(usize, &String)> = unit_ids.iter().enumerate().collect();
        for_chunks(&positioned, 5, |part| {
            let mut params = Vec::with_capacity(part.len() * 5);
            for (position, unit) in part {
                params.extend([
                    text(reservation_id),
                    SqlValue::Integer(*position as i64),
                    text(node_id),
                    text(unit),
                    SqlValue::from(released.contains(*unit)),
                ]);
            }
            let values = vec!["(?, ?, ?, ?, ?)"; part.len()].join(", ");
            exec(
                self.db(),
                &format!(
                    "INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released) VALUES {values}"
                ),
                &params,
            )?;
            Ok(())
        })?;
        Ok(())
    }

    /// Cancels a reservation: operators and the node's owner org. Its units stop being
    /// reserved; VMs on them keep running.
    pub fn cancel_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        reason: Option<&str>,
    ) -> Result<Reservation> {
        in_write_transaction(self.db(), || {
            let header = self
                .reservation_header(node_id, id)?
                .ok_or(DomainError::NotFound {
                    what: "reservation",
                })?;
            if may_read_reservation(ctx.caller, header.parties()) == Decision::NotFound {
                return Err(DomainError::NotFound {
                    what: "reservation",
                }
                .into());
            }
            if !may_write_reservation(ctx.caller, &header.node_owner).is_allowed() {
                return Err(DomainError::Forbidden(
                    "cancelling a reservation is for operators and the node's owner, with reservation.write".into(),
                )
                .into());
            }
            let status = header.status(ctx.now);
            if matches!(status, Status::Cancelled | Status::Expired) {
                return Err(DomainError::AlreadyFinal { status }.into());
            }
            exec(
                self.db(),
                "UPDATE reservations SET state = 'cancelled', updated_at = ? WHERE id = ?",
                &[millis(ctx.now), text(id)],
            )?;
            self.append_event(
                ctx,
                NewEvent {
                    action: "reservation.cancel",
                    node_id: Some(node_id),
                    reservation_id: Some(id),
                    reason,
                    visible_to: visibility(&header),
                    ..NewEvent::default()
                },
            )?;
            self.reload_reservation(node_id, id, ctx.now)
        })
    }

    /// Re-affirms a `needs-review` reservation against the node's current topology, optionally
    /// with a new unit set: operators only. Its status is then derived again.
    pub fn reaffirm_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        new_unit_ids: Option<&[String]>,
        reason: Option<&str>,
    ) -> Result<Reservation> {
        if let Some(units) = new_unit_ids {
            validate_ids("reservedUnitIds", units)?;
        }
        in_write_transaction(self.db(), || {
            let header = self
                .reservation_header(node_id, id)?
                .ok_or(DomainError::NotFound {
                    what: "reservation",
                })?;
            enforce(
                may_reaffirm_reservation(ctx.caller, header.parties()),
                "reservation",
                "only platform operators re-affirm reservations",
            )?;
            let status = header.status(ctx.now);
            if status != Status::NeedsReview {
                return Err(DomainError::NotNeedsReview { status }.into());
            }
            let current = self.load_reservation(header.clone(), ctx.now)?;
            let unit_ids: Vec<String> = match new_unit_ids {
                Some(units) => units.to_vec(),
                None => current.reserved_unit_ids.clone(),
            };
            let request = NewReservation {
                reserved_unit_ids: unit_ids.clone(),
                allowed_org_ids: header.allowed_org_ids.clone(),
                managing_org_ids: header.managing_org_ids.clone(),
                term: header.term,
                contract_ref: header.contract_ref.clone(),
                reason: header.reason.clone(),
            };
            self.check_reservation(node_id, Some(id), &request)?;
            let still_released: BTreeSet<String> = current
                .released_unit_ids
                .iter()
                .filter(|u| unit_ids.contains(u))
                .cloned()
                .collect();
            exec(
                self.db(),
                "DELETE FROM reservation_units WHERE reservation_id = ?",
                &[text(id)],
            )?;
            self.insert_reservation_units(id, node_id, &unit_ids, &still_released)?;
            exec(
                self.db(),
                "UPDATE reservations SET state = 'live', topology_gen = ?, updated_at = ? WHERE id = ?",
                &[
                    SqlValue::Integer(header.node_topology_gen),
                    millis(ctx.now),
                    text(id),
                ],
            )?;
            self.append_event(
                ctx,
                NewEvent {
                    action: "reservation.reaffirm",
                    node_id: Some(node_id),
                    reservation_id: Some(id),
                    unit_ids: &unit_ids,
                    reason,
                    visible_to: visibility(&header),
                    ..NewEvent::default()
                },
            )?;
            self.reload_reservation(node_id, id, ctx.now)
        })
    }
}

/// The orgs that see a reservation's audit events: its node's owner, managers and audience.
pub(crate) fn visibility(header: &ReservationHeader) -> Vec<String> {
    let mut orgs = vec![header.node_owner.clone()];
    orgs.extend(header.managing_org_ids.iter().cloned());
    orgs.extend(header.allowed_org_ids.iter().cloned());
    orgs
}
