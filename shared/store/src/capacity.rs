//! Release, reclaim and dry run against the database. All three load the same facts and ask
//! the same domain function for the plan; only release and reclaim then write it, and the dry
//! run reports it.
//!
//! What a request costs the database, because each statement may be a network round trip
//! to the primary (libSQL): one statement reads every fact (the reservation, the requested
//! units, the running VMs on them with all their units, and for a write the node's audit
//! chain head), and a write is then one insert into `writes` ([`crate::write`]) that applies
//! the plan's lists. No transaction spans them; a dry run is the read alone, one statement
//! and so one snapshot.

use std::collections::BTreeSet;

use reservations_domain::DomainError;
use reservations_domain::Timestamp;
use reservations_domain::access::may_manage_capacity;
use reservations_domain::capacity::{
    CapacityAction, CapacityPlan, CapacityRequest, CapacityTarget, plan_capacity_change,
};
use reservations_domain::notice::validate_notice;
use reservations_domain::reservation::{MAX_UNITS_PER_REQUEST, Reservation, UnitIds};
use reservations_domain::time::from_millis;
use reservations_domain::vm::{RunningVm, Tier};
use serde::Deserialize;

use crate::audit::{Basis, NewEvent, basis_column, read_basis};
use crate::reservations::{
    HEADER_COLUMNS, ReservationHeader, ReservedUnit, UNITS_COLUMN, read_header, read_units,
    visibility,
};
use crate::storage::Guard;
use crate::storage::{exec, first_row, json_list, text};
use crate::write::Fact;
use crate::write::{Changes, EndedVm, NoticedVm, Planned, UnitsOfReservation, Write, node_chain};
use crate::{Capacity, Context, Result, StoreError};

/// The reservation after the operation (unchanged for a dry run) and what the operation did
/// (or, for a dry run, would do).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityOutcome {
    /// Without its unit lists when the request asked for [`Representation::Minimal`].
    pub reservation: Reservation,
    pub representation: Representation,
    pub plan: CapacityPlan,
}

/// How much of the reservation to return. The full representation lists every reserved and
/// released unit, which costs O(size of the reservation); the minimal one leaves the lists
/// out, so the whole operation costs O(units in the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Representation {
    #[default]
    Full,
    Minimal,
}

/// A release, reclaim or dry run as a caller asks for it.
#[derive(Debug, Clone, Copy)]
pub struct CapacityChange<'a> {
    pub action: CapacityAction,
    pub node_id: &'a str,
    pub reservation_id: &'a str,
    pub unit_ids: &'a [String],
    pub reason: Option<&'a str>,
    pub representation: Representation,
    /// Reclaim and dry run: seconds of notice for the spot VMs (absent or 0: stop them now).
    pub notice_seconds: Option<i64>,
    /// Release: when the units come back by themselves (absent: until reclaimed).
    pub until: Option<Timestamp>,
}

impl Capacity<'_, '_> {
    /// Carries out (or, for a dry run, only plans) a capacity request.
    pub fn change_capacity(
        &self,
        ctx: &Context<'_>,
        request: CapacityChange<'_>,
    ) -> Result<CapacityOutcome> {
        match request.action.writes() {
            true => self.carry_out(ctx, || self.plan_capacity(ctx, &request)),
            false => Ok(self.plan_capacity(ctx, &request)?.outcome),
        }
    }

    /// The plan of a capacity request from fresh facts: its outcome, and for a release or
    /// reclaim the write that makes it so (a dry run writes nothing).
    pub fn plan_capacity(
        &self,
        ctx: &Context<'_>,
        request: &CapacityChange<'_>,
    ) -> Result<Planned<CapacityOutcome>> {
        let request = *request;
        // The list's own checks come before the database sees it, so a huge list costs
        // nothing; their verdict waits until the caller is known to manage the reservation,
        // so that nobody else learns from it whether the reservation exists.
        let list_check = UnitIds::check("unitIds", request.unit_ids, MAX_UNITS_PER_REQUEST);
        let asked = list_check
            .as_ref()
            .map_or(&[][..], |units| units.as_slice());
        let mut facts = self
            .capacity_facts(request, asked)?
            .ok_or(DomainError::NotFound {
                what: "reservation",
            })?;
        may_manage_capacity(ctx.caller, facts.header.parties()).enforce(
            "reservation",
            "only operators, the node's owner and the reservation's managing orgs may release or reclaim its units",
        )?;
        let unit_ids = list_check?;
        let notice_seconds = validate_notice(request.notice_seconds)?;
        let target = CapacityTarget {
            status: facts.header.status(ctx.now),
            term: facts.header.term,
            requested_units: std::mem::take(&mut facts.requested_units),
        };
        let asked = CapacityRequest {
            action: request.action,
            unit_ids,
            now: ctx.now,
            notice_seconds,
            until: request.until,
        };
        let plan = plan_capacity_change(&asked, &target, &facts.running_vms)?;
        let write = self.capacity_write(ctx, &facts, request, &plan);
        // All the write changes in the header and units: no need to read them again.
        if request.action.writes() {
            facts.header.updated_at = from_millis(ctx.now.timestamp_millis());
            if let Some(units) = &mut facts.units {
                plan.apply_to_units(
                    units
                        .iter_mut()
                        .map(|unit| (&unit.unit_id, &mut unit.released, &mut unit.released_until)),
                );
            }
        }
        let reservation = match (request.representation, facts.units) {
            (Representation::Full, Some(units)) => facts.header.with_units(units, ctx.now),
            _ => facts.header.without_unit_lists(),
        };
        Ok(Planned {
            outcome: CapacityOutcome {
                reservation,
                representation: request.representation,
                plan,
            },
            write: request.action.writes().then_some(write),
        })
    }

    /// Everything a capacity request needs, in one statement: the reservation's header (and
    /// for the full representation its units), whether each of `unit_ids` belongs to it and
    /// is released, the running VMs on any of `unit_ids` with all of their units, and for a
    /// write its basis (the versions of those facts, the chain's unsealed tail). `None` if
    /// the reservation is not on the node.
    fn capacity_facts(
        &self,
        request: CapacityChange<'_>,
        unit_ids: &[String],
    ) -> Result<Option<CapacityFacts>> {
        let writes = request.action.writes();
        let mut columns = vec![
            HEADER_COLUMNS,
            "(SELECT json_group_array(ru.unit_id) FROM reservation_units ru \
              WHERE ru.reservation_id = r.id \
                AND ru.unit_id IN (SELECT value FROM json_each(?3))) AS requested_units",
            "(SELECT json_group_array(json_object('id', v.id, 'orgId', v.org_id, 'tier', v.tier, \
                'terminatesAt', v.terminates_at, \
                'unitIds', json((SELECT json_group_array(unit_id) FROM \
                    (SELECT unit_id FROM vm_units WHERE vm_id = v.id ORDER BY position))))) \
              FROM vms v WHERE v.id IN (SELECT vm_id FROM vm_units \
                WHERE node_id = r.node_id AND running = 1 \
                  AND unit_id IN (SELECT value FROM json_each(?3)))) AS running_vms",
        ];
        if request.representation == Representation::Full {
            columns.push(UNITS_COLUMN);
        }
        // What the plan reads: the node (its owner), the reservation, the requested units
        // (their claims and releases, the VMs on them) and the VMs running there; and when
        // the answer shows the reservation's unit lists, every unit of it, so that the lists
        // answered are the ones the write left (a release of another unit meanwhile is then
        // a conflict; with `return=minimal` it is not).
        let mut read = format!(
            "SELECT {} AS fact UNION ALL SELECT {} \
             UNION ALL SELECT {} FROM json_each(?3) \
             UNION ALL SELECT {} FROM vm_units \
               WHERE node_id = ?2 AND running = 1 AND unit_id IN (SELECT value FROM json_each(?3))",
            Fact::node("?2"),
            Fact::reservation("?2", "?1"),
            Fact::unit("?2", "value"),
            Fact::vm("?2", "vm_id"),
        );
        if request.representation == Representation::Full {
            read.push_str(&format!(
                " UNION ALL SELECT {} FROM reservation_units WHERE reservation_id = ?1",
                Fact::unit("?2", "unit_id")
            ));
        }
        let basis = basis_column("?4", &read);
        if writes {
            columns.push(&basis);
        }
        let result = exec(
            self.db(),
            &format!(
                "SELECT {} FROM reservations r JOIN nodes n ON n.id = r.node_id \
                 WHERE r.id = ?1 AND r.node_id = ?2",
                columns.join(", ")
            ),
            &[
                text(request.reservation_id),
                text(request.node_id),
                json_list(unit_ids),
                text(&node_chain(request.node_id)),
            ][..if writes { 4 } else { 3 }],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        let running_vms: Vec<RunningVmFacts> = row.json("running_vms")?;
        Ok(Some(CapacityFacts {
            header: read_header(&row)?,
            requested_units: row.json("requested_units")?,
            running_vms: running_vms
                .into_iter()
                .map(|vm| RunningVm {
                    id: vm.id,
                    org_id: vm.org_id,
                    tier: vm.tier,
                    unit_ids: vm.unit_ids,
                    terminates_at: vm.terminates_at.map(from_millis),
                })
                .collect(),
            units: match request.representation {
                Representation::Full => Some(read_units(&row)?),
                Representation::Minimal => None,
            },
            basis: match writes {
                true => Some(read_basis(&row)?),
                false => None,
            },
        }))
    }

    /// The write of a planned release or reclaim: the plan's event and lists, as they are.
    fn capacity_write(
        &self,
        ctx: &Context<'_>,
        facts: &CapacityFacts,
        request: CapacityChange<'_>,
        plan: &CapacityPlan,
    ) -> Write {
        let reservation_id = facts.header.id.clone();
        let units = |unit_ids: &[String], until: Option<Timestamp>| {
            (!unit_ids.is_empty()).then(|| UnitsOfReservation {
                reservation_id: reservation_id.clone(),
                unit_ids: unit_ids.to_vec(),
                until: until.map(|t| t.timestamp_millis()),
            })
        };
        let changes = Changes {
            touched_reservations: vec![reservation_id.clone()],
            released_units: units(&plan.released, plan.released_until),
            reclaimed_units: units(&plan.reclaimed, None),
            ended_vms: plan
                .stopped
                .iter()
                .map(|vm| EndedVm {
                    id: vm.vm_id.clone(),
                    reason: vm.reason.as_str(),
                    at: ctx.now.timestamp_millis(),
                })
                .collect(),
            noticed_vms: plan
                .noticed
                .iter()
                .map(|vm| NoticedVm {
                    id: vm.vm_id.clone(),
                    terminates_at: vm.terminates_at.timestamp_millis(),
                    reason: vm.reason.as_str(),
                    unit_ids: vm.unit_ids.clone(),
                })
                .collect(),
            ..Changes::default()
        };
        let event = NewEvent {
            action: plan.event_action,
            node_id: Some(facts.header.node_id.clone()),
            reservation_id: Some(reservation_id),
            unit_ids: request.unit_ids.to_vec(),
            terminated: plan.terminate.clone(),
            skipped: plan.skip.clone(),
            reason: request.reason.map(str::to_owned),
            visible_to: visibility(&facts.header),
            affected_vms: plan.affected.clone(),
            deadlines: plan.deadlines.clone(),
            release_until: plan.released_until,
            ..NewEvent::default()
        };
        Write::new(
            node_chain(&facts.header.node_id),
            // A dry run reads no basis: its write is planned, never written.
            facts.basis.clone().unwrap_or_default(),
            event,
            changes,
        )
        .refusing(|error, changes| match Guard::of(error) {
            // The schema's own guard, should a non-spot VM have slipped in since planning.
            Some(Guard::UnitsNotIdle) => Some(StoreError::Domain(DomainError::UnitsNotIdle {
                unit_ids: changes
                    .released_units
                    .as_ref()
                    .map(|units| units.unit_ids.clone())
                    .unwrap_or_default(),
                vm_ids: Vec::new(),
            })),
            _ => None,
        })
    }
}

/// What [`Capacity::capacity_facts`] reads.
#[derive(Debug, Clone)]
struct CapacityFacts {
    header: ReservationHeader,
    /// The requested units that belong to the reservation.
    requested_units: BTreeSet<String>,
    /// The VMs running on any of the requested units, with all of their units.
    running_vms: Vec<RunningVm>,
    /// All of the reservation's units, for the full representation.
    units: Option<Vec<ReservedUnit>>,
    /// For a write: what its plan is made on.
    basis: Option<Basis>,
}

/// A running VM as the facts statement returns it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunningVmFacts {
    id: String,
    org_id: String,
    tier: Tier,
    unit_ids: Vec<String>,
    /// The deadline of a VM under notice, in milliseconds.
    terminates_at: Option<i64>,
}
