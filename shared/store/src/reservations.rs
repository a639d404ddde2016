//! Reservations: create, read, list, cancel, re-affirm.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::StorageError;
use crate::write::Fact;
use reservations_domain::access::{
    Decision, ReservationParties, may_list_reservations, may_read_reservation,
    may_reaffirm_reservation, may_write_reservation,
};
use reservations_domain::ids::validate_ids;
use reservations_domain::notice::released_at;
use reservations_domain::reservation::{
    ExistingClaim, NewReservation, Reservation, ReservationContext, Status, StoredState, Term,
    UnitIds, validate_reservation,
};
use reservations_domain::time::from_millis;
use reservations_domain::{DomainError, Timestamp};

use crate::audit::{Basis, NewEvent, basis_column, read_basis};
use crate::cursor::{Listing, Position};
use crate::storage::{Row, exec, first_row, json_list, read_listed, rows, text};
use crate::write::{
    Changes, Planned, ReservationRow, ReservationState, ReservationUnits, Write, node_chain,
};
use crate::{Capacity, Context, Page, Result, UnreadableRow};

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

/// Which reservations to list.
#[derive(Debug, Clone, Default)]
pub struct ReservationFilter {
    pub statuses: Vec<Status>,
    /// Where the previous page ended (a cursor of this listing).
    pub after: Option<Position>,
    pub limit: usize,
}

impl Capacity<'_, '_> {
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
        may_read_reservation(ctx.caller, header.parties())
            .enforce("reservation", "reading reservations needs reservation.read")?;
        Ok(header.with_units(units, ctx.now))
    }

    /// The node's reservations the caller may read, oldest first.
    pub fn list_reservations(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        filter: &ReservationFilter,
    ) -> Result<Page<Reservation>> {
        may_list_reservations(ctx.caller)
            .enforce("node", "listing reservations needs reservation.read")?;
        if self.node_summary(node_id)?.is_none() {
            return Err(DomainError::NotFound { what: "node" }.into());
        }
        let limit = filter.limit.clamp(1, 100);
        let mut matches: Vec<std::result::Result<ReservationHeader, UnreadableRow>> = Vec::new();
        // Where each match stands in the listing's order, for the next page's cursor.
        let mut positions: Vec<Position> = Vec::new();
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
                         WHERE r.node_id = ?1 AND (r.created_at, r.id) > (?2, ?3) \
                         ORDER BY r.created_at, r.id LIMIT 200"
                    ),
                    &[text(node_id), after.created_at.clone(), after.id.clone()],
                )?,
            };
            if result.rows.is_empty() {
                break;
            }
            for row in rows(&result) {
                let position = Position::of_row(&row)?;
                after = Some(position.clone());
                let header = match read_listed(&row, "id", read_header) {
                    Ok(header) => header,
                    Err(unreadable) => {
                        if ctx.caller.is_operator() {
                            matches.push(Err(unreadable));
                            positions.push(position);
                        }
                        continue;
                    }
                };
                let wanted =
                    filter.statuses.is_empty() || filter.statuses.contains(&header.status(ctx.now));
                if wanted && may_read_reservation(ctx.caller, header.parties()).is_allowed() {
                    matches.push(Ok(header));
                    positions.push(position);
                }
            }
        }
        let listing = Listing::reservations(node_id, ctx.caller);
        let mut page = Page::from_overfetched_rows(matches, limit, |h| h.id.clone());
        if page.next_cursor.is_some() {
            page.next_cursor = Some(listing.cursor(&positions[limit - 1]));
        }
        Ok(page.try_map(|header| {
            let key = header.id.clone();
            self.load_reservation(header, ctx.now)
                .map_err(|e| UnreadableRow {
                    key,
                    error: e.to_string(),
                })
        }))
    }

    /// Creates a reservation on a node: operators and the node's owner org.
    pub fn create_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        request: &NewReservation,
    ) -> Result<Reservation> {
        self.carry_out(ctx, || {
            self.plan_create_reservation(ctx, node_id, id, request)
        })
    }

    /// The plan of [`Capacity::create_reservation`] from fresh facts.
    pub fn plan_create_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        request: &NewReservation,
    ) -> Result<Planned<Reservation>> {
        validate_ids("reservedUnitIds", &request.reserved_unit_ids)?;
        validate_ids("allowedOrgIds", &request.allowed_org_ids)?;
        validate_ids("managingOrgIds", &request.managing_org_ids)?;
        let now = from_millis(ctx.now.timestamp_millis());
        let facts = self
            .reservation_facts(node_id, None, request)?
            .ok_or(DomainError::NotFound { what: "node" })?;
        may_write_reservation(ctx.caller, &facts.owner_org_id)
            .enforce("node", "creating reservations needs reservation.write")?;
        facts.check(request)?;
        let mut visible_to = vec![facts.owner_org_id.clone()];
        visible_to.extend(request.managing_org_ids.iter().cloned());
        visible_to.extend(request.allowed_org_ids.iter().cloned());
        let changes = Changes {
            reservations: vec![ReservationRow {
                id: id.to_owned(),
                starts_at: request.term.starts_at.timestamp_millis(),
                ends_at: request.term.ends_at.map(|t| t.timestamp_millis()),
                allowed_org_ids: request.allowed_org_ids.clone(),
                managing_org_ids: request.managing_org_ids.clone(),
                contract_ref: request.contract_ref.clone(),
                reason: request.reason.clone(),
                topology_gen: facts.topology_gen,
            }],
            reservation_units: Some(unit_rows(id, &request.reserved_unit_ids, &[])),
            ..Changes::default()
        };
        let event = NewEvent {
            action: "reservation.create",
            node_id: Some(node_id.to_owned()),
            reservation_id: Some(id.to_owned()),
            unit_ids: request.reserved_unit_ids.clone(),
            reason: request.reason.clone(),
            visible_to,
            ..NewEvent::default()
        };
        let reservation = Reservation {
            id: id.to_owned(),
            node_id: node_id.to_owned(),
            reserved_unit_ids: request.reserved_unit_ids.clone(),
            allowed_org_ids: request.allowed_org_ids.clone(),
            managing_org_ids: request.managing_org_ids.clone(),
            term: request.term,
            contract_ref: request.contract_ref.clone(),
            reason: request.reason.clone(),
            released_unit_ids: Vec::new(),
            released_until: BTreeMap::new(),
            topology_gen: facts.topology_gen,
            created_at: now,
            updated_at: now,
            stored_state: StoredState::Live,
        };
        Ok(Planned {
            outcome: reservation,
            write: Some(Write::new(node_chain(node_id), facts.basis, event, changes)),
        })
    }

    /// What a reservation's units are checked against, in one statement: the node (its
    /// owner and topology generation), which of the units are its, which of the named orgs
    /// exist, the other non-cancelled reservations holding any of the units, and what the
    /// write is made on. `None` if there is no such node.
    fn reservation_facts(
        &self,
        node_id: &str,
        except_reservation: Option<&str>,
        request: &NewReservation,
    ) -> Result<Option<ReservationFacts>> {
        let mut named_orgs: Vec<String> = request.allowed_org_ids.clone();
        named_orgs.extend(request.managing_org_ids.iter().cloned());
        // Cheap list checks first, so a huge bad list costs the database nothing.
        let list_check = UnitIds::check(
            "reservedUnitIds",
            &request.reserved_unit_ids,
            reservations_domain::reservation::MAX_UNITS_PER_NODE,
        );
        let units = list_check
            .as_ref()
            .map_or(&[][..], |units| units.as_slice());
        let result = exec(
            self.db(),
            &format!(
                "SELECT n.owner_org_id AS owner_org_id, n.topology_gen AS topology_gen, \
                 (SELECT json_group_array(unit_id) FROM node_units \
                   WHERE node_id = ?1 AND unit_id IN (SELECT value FROM json_each(?2))) AS on_node, \
                 (SELECT json_group_array(id) FROM orgs \
                   WHERE id IN (SELECT value FROM json_each(?3))) AS known_orgs, \
                 (SELECT json_group_array(json_array(r.id, r.starts_at, r.ends_at, r.state, ru.unit_id)) \
                   FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id \
                   WHERE ru.node_id = ?1 AND r.state <> 'cancelled' AND r.id <> ?4 \
                     AND ru.unit_id IN (SELECT value FROM json_each(?2))) AS claims, \
                 {} FROM nodes n WHERE n.id = ?1",
                basis_column(
                    "?5",
                    &format!(
                        "SELECT {} AS fact \
                         UNION ALL SELECT {} FROM json_each(?2) \
                         UNION ALL SELECT DISTINCT {} FROM reservation_units \
                           WHERE node_id = ?1 AND unit_id IN (SELECT value FROM json_each(?2))",
                        Fact::node("?1"),
                        Fact::unit("?1", "value"),
                        Fact::reservation("?1", "reservation_id"),
                    )
                )
            ),
            &[
                text(node_id),
                json_list(units),
                json_list(&named_orgs),
                text(except_reservation.unwrap_or("")),
                text(&node_chain(node_id)),
            ],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        let mut claims: BTreeMap<String, ExistingClaim> = BTreeMap::new();
        for (id, starts_at, ends_at, state, unit_id) in
            row.json::<Vec<(String, i64, Option<i64>, String, String)>>("claims")?
        {
            claims
                .entry(id.clone())
                .or_insert_with(|| ExistingClaim {
                    reservation_id: id,
                    unit_ids: Vec::new(),
                    term: Term {
                        starts_at: from_millis(starts_at),
                        ends_at: ends_at.map(from_millis),
                    },
                    stored_state: StoredState::parse(&state).unwrap_or(StoredState::Live),
                })
                .unit_ids
                .push(unit_id);
        }
        Ok(Some(ReservationFacts {
            owner_org_id: row.text("owner_org_id")?,
            topology_gen: row.int("topology_gen")?,
            node_unit_ids: row.json("on_node")?,
            known_org_ids: self
                .identity()
                .known_orgs(row.json("known_orgs")?, &named_orgs)?,
            claims: claims.into_values().collect(),
            list_check: list_check.map(|_| ()),
            basis: read_basis(&row)?,
        }))
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
        self.carry_out(ctx, || {
            self.plan_cancel_reservation(ctx, node_id, id, reason)
        })
    }

    /// The plan of [`Capacity::cancel_reservation`] from fresh facts.
    pub fn plan_cancel_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        reason: Option<&str>,
    ) -> Result<Planned<Reservation>> {
        let (header, units, basis) =
            self.header_units_and_basis(node_id, id)?
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
        let changes = Changes {
            reservation_states: vec![ReservationState {
                id: id.to_owned(),
                state: "cancelled",
                topology_gen: None,
            }],
            touched_reservations: vec![id.to_owned()],
            ..Changes::default()
        };
        let event = NewEvent {
            action: "reservation.cancel",
            node_id: Some(node_id.to_owned()),
            reservation_id: Some(id.to_owned()),
            reason: reason.map(str::to_owned),
            visible_to: visibility(&header),
            ..NewEvent::default()
        };
        let mut header = header;
        header.stored_state = StoredState::Cancelled;
        header.updated_at = from_millis(ctx.now.timestamp_millis());
        Ok(Planned {
            outcome: header.with_units(units, ctx.now),
            write: Some(Write::new(node_chain(node_id), basis, event, changes)),
        })
    }

    /// A reservation's header and units and what a write on it is made on (the node, the
    /// reservation and its units), read by one statement.
    fn header_units_and_basis(
        &self,
        node_id: &str,
        id: &str,
    ) -> Result<Option<HeaderUnitsAndBasis>> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT {HEADER_COLUMNS}, {UNITS_COLUMN}, {} \
                 FROM reservations r JOIN nodes n ON n.id = r.node_id \
                 WHERE r.id = ?1 AND r.node_id = ?2",
                basis_column(
                    "?3",
                    &format!(
                        "SELECT {} AS fact UNION ALL SELECT {} \
                         UNION ALL SELECT {} FROM reservation_units WHERE reservation_id = ?1",
                        Fact::node("?2"),
                        Fact::reservation("?2", "?1"),
                        Fact::unit("?2", "unit_id"),
                    )
                )
            ),
            &[text(id), text(node_id), text(&node_chain(node_id))],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        Ok(Some((
            read_header(&row)?,
            read_units(&row)?,
            read_basis(&row)?,
        )))
    }

    /// Re-affirms a `needs-review` reservation against the node's current topology, optionally
    /// with a new unit set: operators only. Its status is then derived again. Units that stay
    /// keep their release, and its end.
    pub fn reaffirm_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        new_unit_ids: Option<&[String]>,
        reason: Option<&str>,
    ) -> Result<Reservation> {
        self.carry_out(ctx, || {
            self.plan_reaffirm_reservation(ctx, node_id, id, new_unit_ids, reason)
        })
    }

    /// The plan of [`Capacity::reaffirm_reservation`] from fresh facts.
    pub fn plan_reaffirm_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: &str,
        id: &str,
        new_unit_ids: Option<&[String]>,
        reason: Option<&str>,
    ) -> Result<Planned<Reservation>> {
        if let Some(units) = new_unit_ids {
            validate_ids("reservedUnitIds", units)?;
        }
        let (header, units, mut basis) =
            self.header_units_and_basis(node_id, id)?
                .ok_or(DomainError::NotFound {
                    what: "reservation",
                })?;
        may_reaffirm_reservation(ctx.caller, header.parties()).enforce(
            "reservation",
            "only platform operators re-affirm reservations",
        )?;
        let status = header.status(ctx.now);
        if status != Status::NeedsReview {
            return Err(DomainError::NotNeedsReview { status }.into());
        }
        let unit_ids: Vec<String> = match new_unit_ids {
            Some(units) => units.to_vec(),
            None => units.iter().map(|u| u.unit_id.clone()).collect(),
        };
        let request = NewReservation {
            reserved_unit_ids: unit_ids.clone(),
            allowed_org_ids: header.allowed_org_ids.clone(),
            managing_org_ids: header.managing_org_ids.clone(),
            term: header.term,
            contract_ref: header.contract_ref.clone(),
            reason: header.reason.clone(),
        };
        let facts = self
            .reservation_facts(node_id, Some(id), &request)?
            .ok_or(DomainError::NotFound { what: "node" })?;
        // The header and the facts come from two statements: the write re-checks what
        // both read.
        facts.check(&request)?;
        basis.facts.extend(facts.basis.facts);
        // Units that stay keep their release as the clock sees it now, with its end.
        let kept: Vec<&ReservedUnit> = units
            .iter()
            .filter(|u| released_at(u.released, u.released_until, ctx.now))
            .collect();
        let changes = Changes {
            reservation_states: vec![ReservationState {
                id: id.to_owned(),
                state: "live",
                topology_gen: Some(header.node_topology_gen),
            }],
            touched_reservations: vec![id.to_owned()],
            replaced_reservation_units: vec![id.to_owned()],
            reservation_units: Some(unit_rows(id, &unit_ids, &kept)),
            ..Changes::default()
        };
        let event = NewEvent {
            action: "reservation.reaffirm",
            node_id: Some(node_id.to_owned()),
            reservation_id: Some(id.to_owned()),
            unit_ids: unit_ids.clone(),
            reason: reason.map(str::to_owned),
            visible_to: visibility(&header),
            ..NewEvent::default()
        };
        let new_units = unit_ids
            .iter()
            .map(
                |unit_id| match kept.iter().find(|k| &k.unit_id == unit_id) {
                    Some(kept) => (*kept).clone(),
                    None => ReservedUnit {
                        unit_id: unit_id.clone(),
                        released: false,
                        released_until: None,
                    },
                },
            )
            .collect();
        let mut header = header;
        header.stored_state = StoredState::Live;
        header.topology_gen = header.node_topology_gen;
        header.updated_at = from_millis(ctx.now.timestamp_millis());
        Ok(Planned {
            outcome: header.with_units(new_units, ctx.now),
            write: Some(Write::new(node_chain(node_id), basis, event, changes)),
        })
    }
}

/// A reservation's header and units, and what a write on it is made on.
type HeaderUnitsAndBasis = (ReservationHeader, Vec<ReservedUnit>, Basis);

/// What a reservation's units are checked against (see [`Capacity::reservation_facts`]).
struct ReservationFacts {
    owner_org_id: String,
    topology_gen: i64,
    node_unit_ids: BTreeSet<String>,
    known_org_ids: BTreeSet<String>,
    claims: Vec<ExistingClaim>,
    /// The unit list's own checks, made before the database saw it.
    list_check: std::result::Result<(), DomainError>,
    basis: Basis,
}

impl ReservationFacts {
    fn check(&self, request: &NewReservation) -> Result<()> {
        self.list_check.clone()?;
        validate_reservation(
            request,
            &ReservationContext {
                node_unit_ids: &self.node_unit_ids,
                known_org_ids: &self.known_org_ids,
                claims: &self.claims,
            },
        )?;
        Ok(())
    }
}

/// A reservation's unit rows, in order; the units among `released` keep their release.
fn unit_rows(
    reservation_id: &str,
    unit_ids: &[String],
    released: &[&ReservedUnit],
) -> ReservationUnits {
    ReservationUnits {
        reservation_id: reservation_id.to_owned(),
        units: unit_ids
            .iter()
            .enumerate()
            .map(|(position, unit_id)| {
                let kept = released.iter().find(|u| &u.unit_id == unit_id);
                (
                    position as i64,
                    unit_id.clone(),
                    kept.is_some(),
                    kept.and_then(|u| u.released_until.map(|t| t.timestamp_millis())),
                )
            })
            .collect(),
    }
}

/// The orgs that see a reservation's audit events: its node's owner, managers and audience.
pub(crate) fn visibility(header: &ReservationHeader) -> Vec<String> {
    let mut orgs = vec![header.node_owner.clone()];
    orgs.extend(header.managing_org_ids.iter().cloned());
    orgs.extend(header.allowed_org_ids.iter().cloned());
    orgs
}
