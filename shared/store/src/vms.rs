//! VMs: placement under the market's rules, reads, listings and termination.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::{SqlValue, StorageError};
use reservations_domain::access::{VmParties, may_place_vm, may_read_vm, may_terminate_vm};
use reservations_domain::audit::AffectedVm;
use reservations_domain::ids::validate_ids;
use reservations_domain::notice::{Interruption, InterruptionReason, released_at, vm_running_at};
use reservations_domain::placement::{
    RefusalReason, UnitClaim, UnitFacts, UnitRefusal, VmNotice, placement_refusals_with,
};
use reservations_domain::reservation::{
    MAX_UNITS_PER_REQUEST, Status, StoredState, Term, derive_status, validate_unit_list,
};
use reservations_domain::vm::{TerminationReason, Tier, Vm, VmStatus, termination_for};
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::reservations::enforce;
use crate::rows::{Row, exec, first_row, millis, placeholders, rows, text};
use crate::schema::{is_unit_busy_violation, refusal};
use crate::tx::in_write_transaction;
use crate::{Context, Page, Result, Store, StoreError};

/// A VM to place for the caller's org.
#[derive(Debug, Clone)]
pub struct NewVm<'a> {
    pub id: &'a str,
    pub node_id: &'a str,
    pub unit_ids: &'a [String],
    pub tier: Tier,
}

/// Which VMs to list.
#[derive(Debug, Clone, Default)]
pub struct VmFilter {
    pub node_id: Option<String>,
    pub status: Option<VmStatus>,
    pub after: Option<String>,
    pub limit: usize,
}

const VM_COLUMNS: &str = "v.id, v.org_id, v.node_id, v.tier, v.status, v.termination_reason, v.created_at, v.terminated_at, \
     v.terminates_at, v.noticed_at, v.interruption_reason, v.interruption_reservation_id, v.interruption_unit_ids";

/// A VM's status as the clock sees it at `?now` (a running VM whose notice ran out has
/// stopped), for filters; [`Vm::at`] is the same rule for rows read.
fn derived_status_sql(now_param: &str) -> String {
    format!(
        "CASE WHEN v.status = 'running' AND v.terminates_at <= {now_param} THEN 'terminated' ELSE v.status END"
    )
}

fn read_vm_row(row: &Row<'_>) -> Result<Vm, StorageError> {
    let bad = |what: &str, value: String| StorageError::Other(format!("unknown {what} {value:?}"));
    let reason = row.opt_text("termination_reason")?;
    Ok(Vm {
        id: row.text("id")?,
        org_id: row.text("org_id")?,
        node_id: row.text("node_id")?,
        unit_ids: Vec::new(),
        tier: row.parsed("tier", "tier", Tier::parse)?,
        status: row.parsed("status", "status", VmStatus::parse)?,
        termination_reason: match reason {
            None => None,
            Some(r) => Some(
                TerminationReason::parse(&r).ok_or_else(|| bad("termination reason", r.clone()))?,
            ),
        },
        created_at: row.time("created_at")?,
        terminated_at: row.opt_time("terminated_at")?,
        interruption: read_interruption(row)?,
    })
}

fn read_interruption(row: &Row<'_>) -> Result<Option<Interruption>, StorageError> {
    let Some(terminates_at) = row.opt_time("terminates_at")? else {
        return Ok(None);
    };
    let reason = row.opt_text("interruption_reason")?.unwrap_or_default();
    Ok(Some(Interruption {
        reason: InterruptionReason::parse(&reason).ok_or_else(|| {
            StorageError::Other(format!("unknown interruption reason {reason:?}"))
        })?,
        noticed_at: row.opt_time("noticed_at")?.unwrap_or(terminates_at),
        terminates_at,
        reservation_id: row
            .opt_text("interruption_reservation_id")?
            .unwrap_or_default(),
        unit_ids: match row.opt_text("interruption_unit_ids")? {
            Some(list) => serde_json::from_str(&list)
                .map_err(|e| StorageError::Other(format!("interruption_unit_ids: {e}")))?,
            None => Vec::new(),
        },
    }))
}

impl Store<'_> {
    /// Places a VM if every unit is free and the placement rules allow it for this org and tier.
    pub fn place_vm(&self, ctx: &Context<'_>, vm: NewVm<'_>) -> Result<Vm> {
        enforce(
            may_place_vm(ctx.caller),
            "node",
            "placing VMs needs an org key with vm.write",
        )?;
        let org = ctx.caller.org_id.clone().unwrap_or_default();
        validate_ids("unitIds", vm.unit_ids)?;
        validate_unit_list("unitIds", vm.unit_ids, MAX_UNITS_PER_REQUEST)?;
        in_write_transaction(self.db(), || {
            if self.node_summary(vm.node_id)?.is_none() {
                return Err(DomainError::NotFound { what: "node" }.into());
            }
            if self.vm_exists(vm.id)? {
                return Err(DomainError::AlreadyExists {
                    what: "VM",
                    id: vm.id.to_owned(),
                }
                .into());
            }
            let facts = self.unit_facts(vm.node_id, vm.unit_ids, ctx.now)?;
            let refusals = placement_refusals_with(&org, vm.tier, &facts.units, &facts.notices);
            if !refusals.is_empty() {
                return Err(DomainError::PlacementRefused { refusals }.into());
            }
            // VMs whose notice ran out still hold their rows' running flag: this write, the
            // first to touch those units since, writes their termination down.
            self.write_down_ended(&facts.ended)?;
            let interruption = release_deadline(&facts.release_ends, vm.unit_ids, ctx.now);
            let interruption = interruption.filter(|_| vm.tier == Tier::Spot);
            exec(
                self.db(),
                "INSERT INTO vms (id, org_id, node_id, tier, status, created_at, terminates_at, noticed_at, \
                 interruption_reason, interruption_reservation_id, interruption_unit_ids) \
                 VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                &[
                    text(vm.id),
                    text(&org),
                    text(vm.node_id),
                    text(vm.tier.as_str()),
                    millis(ctx.now),
                    interruption
                        .as_ref()
                        .map(|i| i.terminates_at.timestamp_millis())
                        .into(),
                    interruption
                        .as_ref()
                        .map(|i| i.noticed_at.timestamp_millis())
                        .into(),
                    interruption.as_ref().map(|i| i.reason.as_str()).into(),
                    interruption
                        .as_ref()
                        .map(|i| i.reservation_id.clone())
                        .into(),
                    interruption
                        .as_ref()
                        .map(|i| serde_json::to_string(&i.unit_ids).expect("ids serialize"))
                        .into(),
                ],
            )?;
            let mut params = Vec::with_capacity(vm.unit_ids.len() * 7);
            for (position, unit) in vm.unit_ids.iter().enumerate() {
                params.extend([
                    text(vm.id),
                    SqlValue::Integer(position as i64),
                    text(vm.node_id),
                    text(unit),
                    text(vm.tier.as_str()),
                    SqlValue::Integer(1),
                    millis(ctx.now),
                ]);
            }
            exec(
                self.db(),
                &format!(
                    "INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at) VALUES {}",
                    vec!["(?, ?, ?, ?, ?, ?, ?)"; vm.unit_ids.len()].join(", ")
                ),
                &params,
            )
            .map_err(|e| schema_refusal(e, vm.unit_ids))?;
            let mut visible_to = vec![org.clone()];
            visible_to.extend(self.capacity_managers(vm.node_id, vm.unit_ids, ctx.now)?);
            self.append_event(
                ctx,
                NewEvent {
                    action: "vm.place",
                    node_id: Some(vm.node_id),
                    vm_id: Some(vm.id),
                    org_id: Some(&org),
                    unit_ids: vm.unit_ids,
                    visible_to,
                    deadlines: interruption
                        .iter()
                        .map(|i| (vm.id.to_owned(), i.terminates_at))
                        .collect(),
                    ..NewEvent::default()
                },
            )?;
            Ok(Vm {
                id: vm.id.to_owned(),
                org_id: org.clone(),
                node_id: vm.node_id.to_owned(),
                unit_ids: vm.unit_ids.to_vec(),
                tier: vm.tier,
                status: VmStatus::Running,
                termination_reason: None,
                created_at: ctx.now,
                terminated_at: None,
                interruption,
            })
        })
    }

    /// Writes down the termination of VMs whose notice ran out (their rows still say
    /// running): status, reason and time as every read already derives them.
    fn write_down_ended(&self, ended: &[(String, TerminationReason, Timestamp)]) -> Result<()> {
        for (vm_id, reason, at) in ended {
            exec(
                self.db(),
                "UPDATE vms SET status = 'terminated', termination_reason = ?, terminated_at = ? \
                 WHERE id = ? AND status = 'running'",
                &[text(reason.as_str()), millis(*at), text(vm_id)],
            )?;
            exec(
                self.db(),
                "UPDATE vm_units SET running = 0 WHERE vm_id = ? AND running = 1",
                &[text(vm_id)],
            )?;
        }
        Ok(())
    }

    fn vm_exists(&self, id: &str) -> Result<bool> {
        let result = exec(self.db(), "SELECT 1 FROM vms WHERE id = ?", &[text(id)])?;
        Ok(!result.rows.is_empty())
    }

    /// What placement needs to know about each requested unit.
    fn unit_facts(
        &self,
        node_id: &str,
        unit_ids: &[String],
        now: Timestamp,
    ) -> Result<PlacementFacts> {
        let on_node = self.units_on_node(node_id, unit_ids)?;
        let mut params = vec![text(node_id)];
        params.extend(unit_ids.iter().map(|u| text(u)));
        let in_list = placeholders(unit_ids.len());
        let running = exec(
            self.db(),
            &format!(
                "SELECT vu.unit_id, vu.vm_id, v.terminates_at, v.interruption_reason, v.interruption_reservation_id \
                 FROM vm_units vu JOIN vms v ON v.id = vu.vm_id \
                 WHERE vu.node_id = ? AND vu.running = 1 AND vu.unit_id IN ({in_list})"
            ),
            &params,
        )?;
        let mut running_vms: BTreeMap<String, String> = BTreeMap::new();
        let mut notices: BTreeMap<String, VmNotice> = BTreeMap::new();
        let mut ended: Vec<(String, TerminationReason, Timestamp)> = Vec::new();
        for r in rows(&running) {
            let vm_id = r.text("vm_id")?;
            let deadline = r.opt_time("terminates_at")?;
            if !vm_running_at(deadline, now) {
                let reason = r.opt_text("interruption_reason")?.unwrap_or_default();
                let reason = InterruptionReason::parse(&reason)
                    .map_or(TerminationReason::Reclaimed, termination_for);
                if !ended.iter().any(|(id, ..)| id == &vm_id) {
                    ended.push((vm_id, reason, deadline.unwrap_or(now)));
                }
                continue;
            }
            if let Some(terminates_at) = deadline {
                notices.insert(
                    vm_id.clone(),
                    VmNotice {
                        terminates_at,
                        reservation_id: r
                            .opt_text("interruption_reservation_id")?
                            .unwrap_or_default(),
                    },
                );
            }
            running_vms.insert(r.text("unit_id")?, vm_id);
        }
        let claims = exec(
            self.db(),
            &format!(
                "SELECT ru.unit_id, r.id, r.state, r.starts_at, r.ends_at, ru.released, ru.released_until, r.allowed_org_ids, \
                 r.managing_org_ids, n.owner_org_id \
                 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id \
                 JOIN nodes n ON n.id = r.node_id \
                 WHERE ru.node_id = ? AND r.state <> 'cancelled' AND ru.unit_id IN ({in_list})"
            ),
            &params,
        )?;
        let mut claims_by_unit: BTreeMap<String, Vec<UnitClaim>> = BTreeMap::new();
        let mut release_ends: BTreeMap<String, (Timestamp, String)> = BTreeMap::new();
        for row in rows(&claims) {
            let stored = row.parsed("state", "reservation state", StoredState::parse)?;
            let term = Term {
                starts_at: row.time("starts_at")?,
                ends_at: row.opt_time("ends_at")?,
            };
            let allowed_org_ids = row.string_list("allowed_org_ids")?;
            let mut party_org_ids = row.string_list("managing_org_ids")?;
            party_org_ids.push(row.text("owner_org_id")?);
            party_org_ids.extend(allowed_org_ids.iter().cloned());
            let status = derive_status(stored, &term, now);
            let until = row.opt_time("released_until")?;
            let released = released_at(row.bool("released")?, until, now);
            let unit_id = row.text("unit_id")?;
            let reservation_id = row.text("id")?;
            if let (true, Some(until), Status::Active) = (released, until, status) {
                release_ends.insert(unit_id.clone(), (until, reservation_id.clone()));
            }
            claims_by_unit.entry(unit_id).or_default().push(UnitClaim {
                reservation_id,
                status,
                released,
                allowed_org_ids,
                party_org_ids,
            });
        }
        Ok(PlacementFacts {
            units: unit_ids
                .iter()
                .map(|unit| UnitFacts {
                    unit_id: unit.clone(),
                    on_node: on_node.contains(unit),
                    running_vm: running_vms.get(unit).cloned(),
                    claims: claims_by_unit.remove(unit).unwrap_or_default(),
                })
                .collect(),
            notices,
            ended,
            release_ends,
        })
    }

    /// Owners and managing orgs of the active reservations holding any of `unit_ids`: the orgs
    /// that may see and stop spot VMs there.
    fn capacity_managers(
        &self,
        node_id: &str,
        unit_ids: &[String],
        now: Timestamp,
    ) -> Result<BTreeSet<String>> {
        let mut params = vec![text(node_id)];
        params.extend(unit_ids.iter().map(|u| text(u)));
        let result = exec(
            self.db(),
            &format!(
                "SELECT DISTINCT r.id, n.owner_org_id, r.managing_org_ids, r.state, r.starts_at, r.ends_at \
                 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id \
                 JOIN nodes n ON n.id = r.node_id \
                 WHERE ru.node_id = ? AND r.state = 'live' AND ru.unit_id IN ({})",
                placeholders(unit_ids.len())
            ),
            &params,
        )?;
        let mut managers = BTreeSet::new();
        for row in rows(&result) {
            let term = Term {
                starts_at: row.time("starts_at")?,
                ends_at: row.opt_time("ends_at")?,
            };
            if term.contains(now) {
                managers.insert(row.text("owner_org_id")?);
                managers.extend(row.string_list("managing_org_ids")?);
            }
        }
        Ok(managers)
    }

    /// A VM as the clock sees it at `now`.
    fn load_vm(&self, id: &str, now: Timestamp) -> Result<Option<Vm>> {
        let result = exec(
            self.db(),
            &format!("SELECT {VM_COLUMNS} FROM vms v WHERE v.id = ?"),
            &[text(id)],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        let mut vm = read_vm_row(&row)?;
        vm.unit_ids = self.vm_unit_ids(id)?;
        Ok(Some(vm.at(now)))
    }

    fn vm_unit_ids(&self, id: &str) -> Result<Vec<String>> {
        let result = exec(
            self.db(),
            "SELECT unit_id FROM vm_units WHERE vm_id = ? ORDER BY position",
            &[text(id)],
        )?;
        Ok(rows(&result)
            .map(|r| r.text("unit_id"))
            .collect::<Result<_, _>>()?)
    }

    /// A VM and the orgs managing the capacity it sits on: what decides who sees and stops it.
    fn vm_and_capacity_managers(&self, id: &str, now: Timestamp) -> Result<(Vm, Vec<String>)> {
        let vm = self
            .load_vm(id, now)?
            .ok_or(DomainError::NotFound { what: "VM" })?;
        let managers = self
            .capacity_managers(&vm.node_id, &vm.unit_ids, now)?
            .into_iter()
            .collect();
        Ok((vm, managers))
    }

    /// A VM the caller may read.
    pub fn read_vm(&self, ctx: &Context<'_>, id: &str) -> Result<Vm> {
        let (vm, managers) = self.vm_and_capacity_managers(id, ctx.now)?;
        let parties = vm_parties(&vm, &managers);
        enforce(
            may_read_vm(ctx.caller, &parties),
            "VM",
            "reading VMs needs vm.read",
        )?;
        Ok(vm)
    }

    /// VMs the caller may read: its own org's, and those on units of active reservations it
    /// owns or manages (operators: all). Ordered by id.
    pub fn list_vms(&self, ctx: &Context<'_>, filter: &VmFilter) -> Result<Page<Vm>> {
        if !ctx
            .caller
            .has(reservations_domain::access::Permission::VmRead)
        {
            return Err(DomainError::Forbidden("listing VMs needs vm.read".into()).into());
        }
        let limit = filter.limit.clamp(1, 500);
        let org = ctx.caller.org_id.clone();
        let result = exec(
            self.db(),
            &format!(
                "SELECT {VM_COLUMNS} FROM vms v \
                 WHERE v.id > ?1 AND (?2 IS NULL OR v.node_id = ?2) AND (?3 IS NULL OR {} = ?3) \
                 AND (?4 IS NULL OR v.org_id = ?4 OR EXISTS ( \
                     SELECT 1 FROM vm_units vu \
                     JOIN reservation_units ru ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
                     JOIN reservations r ON r.id = ru.reservation_id \
                     JOIN nodes n ON n.id = r.node_id \
                     WHERE vu.vm_id = v.id AND r.state = 'live' AND r.starts_at <= ?5 \
                       AND (r.ends_at IS NULL OR r.ends_at > ?5) \
                       AND (n.owner_org_id = ?4 OR EXISTS (SELECT 1 FROM json_each(r.managing_org_ids) WHERE value = ?4)))) \
                 ORDER BY v.id LIMIT ?6",
                derived_status_sql("?5")
            ),
            &[
                text(filter.after.as_deref().unwrap_or("")),
                filter.node_id.clone().into(),
                filter.status.map(|s| s.as_str().to_owned()).into(),
                org.into(),
                millis(ctx.now),
                SqlValue::Integer(limit as i64 + 1),
            ],
        )?;
        let items = rows(&result)
            .map(|r| read_vm_row(&r).map(|vm| vm.at(ctx.now)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut page = Page::from_overfetched(items, limit, |v| v.id.clone());
        for vm in &mut page.items {
            vm.unit_ids = self.vm_unit_ids(&vm.id)?;
        }
        Ok(page)
    }

    /// Terminates a VM: its org, an operator, or — for a spot VM on reserved units — the
    /// units' capacity managers holding `reservation.capacity`.
    pub fn terminate_vm(&self, ctx: &Context<'_>, id: &str) -> Result<Vm> {
        in_write_transaction(self.db(), || {
            let (vm, managers) = self.vm_and_capacity_managers(id, ctx.now)?;
            let parties = vm_parties(&vm, &managers);
            enforce(
                may_terminate_vm(ctx.caller, &parties),
                "VM",
                "only the VM's org (vm.write), operators, and for spot VMs the capacity owners (reservation.capacity) may terminate it",
            )?;
            if vm.status == VmStatus::Terminated {
                return Err(DomainError::VmAlreadyTerminated.into());
            }
            let reason = if ctx.caller.is_org(&vm.org_id) {
                TerminationReason::Stopped
            } else if ctx.caller.is_operator() {
                TerminationReason::StoppedByOperator
            } else {
                TerminationReason::TerminatedByCapacityOwner
            };
            exec(
                self.db(),
                "UPDATE vms SET status = 'terminated', termination_reason = ?, terminated_at = ? \
                 WHERE id = ? AND status = 'running'",
                &[text(reason.as_str()), millis(ctx.now), text(&vm.id)],
            )?;
            exec(
                self.db(),
                "UPDATE vm_units SET running = 0 WHERE vm_id = ?",
                &[text(&vm.id)],
            )?;
            // The capacity managers are principals; the VM's org, when another org stopped its
            // VM, learns only that its VM was terminated (see `reservations_domain::audit`).
            let affected_vms = vec![AffectedVm {
                vm_id: vm.id.clone(),
                org_id: vm.org_id.clone(),
                unit_ids: vm.unit_ids.clone(),
            }];
            let terminated = [vm.id.clone()];
            self.append_event(
                ctx,
                NewEvent {
                    action: "vm.terminate",
                    node_id: Some(&vm.node_id),
                    vm_id: Some(&vm.id),
                    org_id: Some(&vm.org_id),
                    unit_ids: &vm.unit_ids,
                    terminated: &terminated,
                    reason: Some(reason.as_str()),
                    visible_to: managers.to_vec(),
                    affected_vms,
                    ..NewEvent::default()
                },
            )?;
            Ok(Vm {
                status: VmStatus::Terminated,
                termination_reason: Some(reason),
                terminated_at: Some(ctx.now),
                ..vm
            })
        })
    }
}

/// What placement reads about the requested units.
struct PlacementFacts {
    units: Vec<UnitFacts>,
    /// Running VMs on them under notice.
    notices: BTreeMap<String, VmNotice>,
    /// VMs on them whose notice ran out, not yet written down: id, why, when.
    ended: Vec<(String, TerminationReason, Timestamp)>,
    /// Units released only until a time, by an active reservation: when, and which.
    release_ends: BTreeMap<String, (Timestamp, String)>,
}

/// The notice a spot VM gets at placement on units released only until a time: the
/// earliest end among its units, from the reservation that set it.
fn release_deadline(
    release_ends: &BTreeMap<String, (Timestamp, String)>,
    unit_ids: &[String],
    now: Timestamp,
) -> Option<Interruption> {
    let (terminates_at, reservation_id) = unit_ids
        .iter()
        .filter_map(|u| release_ends.get(u))
        .min()?
        .clone();
    Some(Interruption {
        reason: InterruptionReason::ReleaseEnds,
        noticed_at: now,
        terminates_at,
        unit_ids: unit_ids
            .iter()
            .filter(|u| {
                release_ends
                    .get(*u)
                    .is_some_and(|(_, r)| *r == reservation_id)
            })
            .cloned()
            .collect(),
        reservation_id,
    })
}

fn vm_parties<'a>(vm: &'a Vm, managers: &'a [String]) -> VmParties<'a> {
    VmParties {
        vm_org: &vm.org_id,
        is_spot: vm.tier == Tier::Spot,
        capacity_managers: managers,
    }
}

/// Maps the schema's own placement guards to the refusal the rules would have given.
fn schema_refusal(error: StorageError, unit_ids: &[String]) -> StoreError {
    let reason = if is_unit_busy_violation(&error) {
        Some(RefusalReason::UnitBusy)
    } else {
        match refusal(&error) {
            Some("released-spot-only") => Some(RefusalReason::ReleasedSpotOnly),
            Some("withheld-needs-review") => Some(RefusalReason::WithheldNeedsReview),
            _ => None,
        }
    };
    match reason {
        Some(reason) => StoreError::Domain(DomainError::PlacementRefused {
            refusals: unit_ids
                .iter()
                .map(|unit_id| UnitRefusal::new(unit_id.clone(), reason))
                .collect(),
        }),
        None => error.into(),
    }
}
