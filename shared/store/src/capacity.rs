//! Release, reclaim and dry run against the database. All three load the same facts and ask
//! the same domain function for the plan; only release and reclaim then write it (in one
//! transaction with their audit event), and the dry run reports it.

use std::collections::BTreeMap;

use reservations_domain::DomainError;
use reservations_domain::access::may_manage_capacity;
use reservations_domain::audit::AffectedVm;
use reservations_domain::capacity::{
    CapacityAction, CapacityPlan, CapacityTarget, plan_capacity_change,
};
use reservations_domain::reservation::{MAX_UNITS_PER_REQUEST, Reservation, validate_unit_list};
use reservations_domain::storage::SqlValue;
use reservations_domain::time::from_millis;
use reservations_domain::vm::{RunningVm, TerminationReason, Tier};

use crate::audit::NewEvent;
use crate::reservations::{ReservationHeader, enforce, visibility};
use crate::rows::{exec, millis, placeholders, rows};
use crate::schema::{refusal, text};
use crate::tx::in_write_transaction;
use crate::{Context, Result, Store, StoreError};

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
pub struct CapacityRequest<'a> {
    pub action: CapacityAction,
    pub node_id: &'a str,
    pub reservation_id: &'a str,
    pub unit_ids: &'a [String],
    pub reason: Option<&'a str>,
    pub representation: Representation,
}

impl Store<'_> {
    /// Carries out (or, for a dry run, only plans) a capacity request.
    pub fn change_capacity(
        &self,
        ctx: &Context<'_>,
        request: CapacityRequest<'_>,
    ) -> Result<CapacityOutcome> {
        if request.action.writes() {
            in_write_transaction(self.db(), || self.plan_and_apply(ctx, request))
        } else {
            // A read transaction, so the dry run sees one consistent snapshot.
            self.db().execute("BEGIN", &[])?;
            let outcome = self.plan_and_apply(ctx, request);
            let _ = self.db().execute(
                if outcome.is_ok() {
                    "COMMIT"
                } else {
                    "ROLLBACK"
                },
                &[],
            );
            outcome
        }
    }

    fn plan_and_apply(
        &self,
        ctx: &Context<'_>,
        request: CapacityRequest<'_>,
    ) -> Result<CapacityOutcome> {
        let mut header = self
            .reservation_header(request.node_id, request.reservation_id)?
            .ok_or(DomainError::NotFound {
                what: "reservation",
            })?;
        enforce(
            may_manage_capacity(ctx.caller, header.parties()),
            "reservation",
            "only operators, the node's owner and the reservation's managing orgs may release or reclaim its units",
        )?;
        // The list's own checks come before any query, so a huge list costs nothing.
        validate_unit_list("unitIds", request.unit_ids, MAX_UNITS_PER_REQUEST)?;
        let target = CapacityTarget {
            status: header.status(ctx.now),
            requested_units: self.requested_units(&header.id, request.unit_ids)?,
        };
        let running_vms = self.running_vms_on(&header.node_id, request.unit_ids)?;
        let plan = plan_capacity_change(request.action, request.unit_ids, &target, &running_vms)?;
        if request.action.writes() {
            self.apply(ctx, &header, request, &plan)?;
            // All the write changed in the header; no need to read it again.
            header.updated_at = from_millis(ctx.now.timestamp_millis());
        }
        let reservation = match request.representation {
            Representation::Full => self.load_reservation(header)?,
            Representation::Minimal => header.without_unit_lists(),
        };
        Ok(CapacityOutcome {
            reservation,
            representation: request.representation,
            plan,
        })
    }

    /// For each requested unit that belongs to the reservation, whether it is released.
    fn requested_units(
        &self,
        reservation_id: &str,
        unit_ids: &[String],
    ) -> Result<BTreeMap<String, bool>> {
        let mut params = vec![text(reservation_id)];
        params.extend(unit_ids.iter().map(|u| text(u)));
        let result = exec(
            self.db(),
            &format!(
                "SELECT unit_id, released FROM reservation_units WHERE reservation_id = ? AND unit_id IN ({})",
                placeholders(unit_ids.len())
            ),
            &params,
        )?;
        rows(&result)
            .map(|row| Ok((row.text(0)?, row.bool(1)?)))
            .collect()
    }

    /// The running VMs on any of `unit_ids`, each with all of its units.
    pub(crate) fn running_vms_on(
        &self,
        node_id: &str,
        unit_ids: &[String],
    ) -> Result<Vec<RunningVm>> {
        let mut params = vec![text(node_id)];
        params.extend(unit_ids.iter().map(|u| text(u)));
        let result = exec(
            self.db(),
            &format!(
                "SELECT DISTINCT vm_id FROM vm_units WHERE node_id = ? AND running = 1 AND unit_id IN ({})",
                placeholders(unit_ids.len())
            ),
            &params,
        )?;
        let vm_ids: Vec<String> = rows(&result).map(|r| r.text(0)).collect::<Result<_, _>>()?;
        if vm_ids.is_empty() {
            return Ok(Vec::new());
        }
        let result = exec(
            self.db(),
            &format!(
                "SELECT vm_id, tier, unit_id FROM vm_units WHERE vm_id IN ({}) ORDER BY vm_id, position",
                placeholders(vm_ids.len())
            ),
            &vm_ids.iter().map(|v| text(v)).collect::<Vec<_>>(),
        )?;
        let mut vms: Vec<RunningVm> = Vec::with_capacity(vm_ids.len());
        for row in rows(&result) {
            let vm_id = row.text(0)?;
            let unit = row.text(2)?;
            match vms.last_mut() {
                Some(vm) if vm.id == vm_id => vm.unit_ids.push(unit),
                _ => {
                    let tier_name = row.text(1)?;
                    let tier = Tier::parse(&tier_name).ok_or_else(|| {
                        StoreError::Storage(reservations_domain::storage::StorageError::Other(
                            format!("unknown tier {tier_name:?}"),
                        ))
                    })?;
                    vms.push(RunningVm {
                        id: vm_id,
                        tier,
                        unit_ids: vec![unit],
                    });
                }
            }
        }
        Ok(vms)
    }

    fn apply(
        &self,
        ctx: &Context<'_>,
        header: &ReservationHeader,
        request: CapacityRequest<'_>,
        plan: &CapacityPlan,
    ) -> Result<()> {
        let set_released = |units: &[String], released: bool| -> Result<()> {
            if units.is_empty() {
                return Ok(());
            }
            let mut params = vec![SqlValue::from(released), text(&header.id)];
            params.extend(units.iter().map(|u| text(u)));
            exec(
                self.db(),
                &format!(
                    "UPDATE reservation_units SET released = ? WHERE reservation_id = ? AND unit_id IN ({})",
                    placeholders(units.len())
                ),
                &params,
            )
            .map_err(|e| match refusal(&e) {
                // The schema's own guard, should a non-spot VM have slipped in since planning.
                Some("units-not-idle") => StoreError::Domain(DomainError::UnitsNotIdle {
                    unit_ids: units.to_vec(),
                    vm_ids: Vec::new(),
                }),
                _ => e.into(),
            })?;
            Ok(())
        };
        set_released(&plan.newly_released, true)?;
        set_released(&plan.newly_reclaimed, false)?;
        self.terminate_vms(ctx, &plan.terminate, TerminationReason::Reclaimed)?;
        exec(
            self.db(),
            "UPDATE reservations SET updated_at = ? WHERE id = ?",
            &[millis(ctx.now), text(&header.id)],
        )?;
        let affected_vms = self.affected_vms(&plan.terminate)?;
        self.append_event(
            ctx,
            NewEvent {
                action: match request.action {
                    CapacityAction::Release => "reservation.release",
                    _ => "reservation.reclaim",
                },
                node_id: Some(&header.node_id),
                reservation_id: Some(&header.id),
                unit_ids: request.unit_ids,
                terminated: &plan.terminate,
                skipped: &plan.skip,
                reason: request.reason,
                visible_to: visibility(header),
                affected_vms,
                ..NewEvent::default()
            },
        )?;
        Ok(())
    }

    /// Terminates running VMs (their units are free at once).
    pub(crate) fn terminate_vms(
        &self,
        ctx: &Context<'_>,
        vm_ids: &[String],
        reason: TerminationReason,
    ) -> Result<()> {
        if vm_ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<SqlValue> = vm_ids.iter().map(|v| text(v)).collect();
        let mut params = vec![text(reason.as_str()), millis(ctx.now)];
        params.extend(ids.iter().cloned());
        exec(
            self.db(),
            &format!(
                "UPDATE vms SET status = 'terminated', termination_reason = ?, terminated_at = ? \
                 WHERE status = 'running' AND id IN ({})",
                placeholders(vm_ids.len())
            ),
            &params,
        )?;
        exec(
            self.db(),
            &format!(
                "UPDATE vm_units SET running = 0 WHERE vm_id IN ({})",
                placeholders(vm_ids.len())
            ),
            &ids,
        )?;
        Ok(())
    }

    /// The VMs an event terminates, with their orgs and units: who must be told.
    pub(crate) fn affected_vms(&self, vm_ids: &[String]) -> Result<Vec<AffectedVm>> {
        if vm_ids.is_empty() {
            return Ok(Vec::new());
        }
        let result = exec(
            self.db(),
            &format!(
                "SELECT v.id, v.org_id, u.unit_id FROM vms v JOIN vm_units u ON u.vm_id = v.id \
                 WHERE v.id IN ({}) ORDER BY v.id, u.position",
                placeholders(vm_ids.len())
            ),
            &vm_ids.iter().map(|v| text(v)).collect::<Vec<_>>(),
        )?;
        let mut affected: Vec<AffectedVm> = Vec::new();
        for row in rows(&result) {
            let (vm_id, unit_id) = (row.text(0)?, row.text(2)?);
            match affected.last_mut() {
                Some(vm) if vm.vm_id == vm_id => vm.unit_ids.push(unit_id),
                _ => affected.push(AffectedVm {
                    vm_id,
                    org_id: row.text(1)?,
                    unit_ids: vec![unit_id],
                }),
            }
        }
        Ok(affected)
    }
}
