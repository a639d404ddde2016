//! VMs: placement under the market's rules, reads, listings and termination.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::{Guard, SqlValue, StorageError};
use crate::write::Fact;
use reservations_domain::access::{VmParties, may_place_vm, may_read_vm, may_terminate_vm};
use reservations_domain::audit::AffectedVm;
use reservations_domain::ids::validate_ids;
use reservations_domain::notice::{
    Interruption, InterruptionReason, placement_notice, released_at, vm_running_at,
};
use reservations_domain::placement::{
    RefusalReason, UnitClaim, UnitFacts, UnitRefusal, VmNotice, placement_refusals_with,
};
use reservations_domain::reservation::{
    MAX_UNITS_PER_REQUEST, Status, StoredState, Term, UnitIds, derive_status,
};
use reservations_domain::vm::{TerminationReason, Tier, Vm, VmStatus, termination_for};
use reservations_domain::{DomainError, Timestamp};

use reservations_domain::time::from_millis;
use serde::Deserialize;

use crate::audit::{Basis, NewEvent, basis_column, read_basis};
use crate::storage::{Row, exec, first_row, json_list, millis, read_listed, rows, text};
use crate::write::{Changes, EndedVm, Planned, VmRow, Write, node_chain};
use crate::{Capacity, Context, Page, Result, StoreError};

/// The most VMs one page of the listing holds.
pub const MAX_VM_PAGE: usize = 500;

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

/// A column `vm_unit_ids` of the VM `v`: its units, in the order it was placed on them.
/// A unit id that is not text (a damaged row) becomes `null`, so the VM reads as unreadable
/// rather than the statement failing.
const VM_UNIT_IDS_COLUMN: &str = "(SELECT json_group_array(CASE WHEN typeof(unit_id) = 'text' \
     THEN unit_id END) FROM \
     (SELECT unit_id FROM vm_units WHERE vm_id = v.id ORDER BY position)) AS vm_unit_ids";

/// The status of the VM aliased `vm` as the clock sees it at `now_param` (a running VM whose
/// notice ran out has stopped), for filters; [`Vm::at`] is the same rule for rows read.
fn derived_status_sql(vm: &str, now_param: &str) -> String {
    format!(
        "CASE WHEN {vm}.status = 'running' AND {vm}.terminates_at <= {now_param} \
         THEN 'terminated' ELSE {vm}.status END"
    )
}

fn read_vm_row(row: &Row<'_>) -> Result<Vm, StorageError> {
    let bad =
        |what: &str, value: String| StorageError::Other(format!("unknown {what} {value:?}").into());
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
            StorageError::Other(format!("unknown interruption reason {reason:?}").into())
        })?,
        noticed_at: row.opt_time("noticed_at")?.unwrap_or(terminates_at),
        terminates_at,
        reservation_id: row
            .opt_text("interruption_reservation_id")?
            .unwrap_or_default(),
        unit_ids: match row.opt_text("interruption_unit_ids")? {
            Some(list) => serde_json::from_str(&list)
                .map_err(|e| StorageError::Other(format!("interruption_unit_ids: {e}").into()))?,
            None => Vec::new(),
        },
    }))
}

impl Capacity<'_, '_> {
    /// Places a VM if every unit is free and the placement rules allow it for this org and tier.
    pub fn place_vm(&self, ctx: &Context<'_>, vm: NewVm<'_>) -> Result<Vm> {
        self.carry_out(ctx, || self.plan_place_vm(ctx, &vm))
    }

    /// The plan of [`Capacity::place_vm`] from fresh facts.
    pub fn plan_place_vm(&self, ctx: &Context<'_>, vm: &NewVm<'_>) -> Result<Planned<Vm>> {
        may_place_vm(ctx.caller).enforce("node", "placing VMs needs an org key with vm.write")?;
        let org = ctx.caller.org_id.clone().unwrap_or_default();
        validate_ids("unitIds", vm.unit_ids)?;
        UnitIds::check("unitIds", vm.unit_ids, MAX_UNITS_PER_REQUEST)?;
        let facts = self
            .placement_facts(vm.node_id, vm.id, vm.unit_ids, &org, ctx.now)?
            .ok_or(DomainError::NotFound { what: "node" })?;
        if facts.vm_exists {
            return Err(DomainError::AlreadyExists {
                what: "VM",
                id: vm.id.to_owned(),
            }
            .into());
        }
        let refusals = placement_refusals_with(&org, vm.tier, &facts.units, &facts.notices);
        if !refusals.is_empty() {
            return Err(DomainError::PlacementRefused { refusals }.into());
        }
        if !facts.org_here && self.directory.is_some() {
            self.identity()
                .orgs_from_directory(std::slice::from_ref(&org))?;
        }
        let interruption = placement_notice(vm.tier, &facts.release_ends, vm.unit_ids, ctx.now);
        let mut visible_to = vec![org.clone()];
        visible_to.extend(facts.capacity_managers.iter().cloned());
        let changes = Changes {
            // VMs whose notice ran out still hold their rows' running flag: this write,
            // the first to touch those units since, writes their termination down.
            ended_vms: facts
                .ended
                .iter()
                .map(|(id, reason, at)| EndedVm {
                    id: id.clone(),
                    reason: reason.as_str(),
                    at: at.timestamp_millis(),
                })
                .collect(),
            vms: vec![VmRow {
                id: vm.id.to_owned(),
                org_id: org.clone(),
                tier: vm.tier.as_str(),
                unit_ids: vm.unit_ids.to_vec(),
                terminates_at: interruption
                    .as_ref()
                    .map(|i| i.terminates_at.timestamp_millis()),
                interruption_reason: interruption.as_ref().map(|i| i.reason.as_str()),
                interruption_reservation_id: interruption
                    .as_ref()
                    .map(|i| i.reservation_id.clone()),
                interruption_unit_ids: interruption.as_ref().map(|i| i.unit_ids.clone()),
            }],
            ..Changes::default()
        };
        let event = NewEvent {
            action: "vm.place",
            node_id: Some(vm.node_id.to_owned()),
            vm_id: Some(vm.id.to_owned()),
            org_id: Some(org.clone()),
            unit_ids: vm.unit_ids.to_vec(),
            visible_to,
            deadlines: interruption
                .iter()
                .map(|i| (vm.id.to_owned(), i.terminates_at))
                .collect(),
            ..NewEvent::default()
        };
        Ok(Planned {
            outcome: Vm {
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
            },
            write: Some(
                Write::new(node_chain(vm.node_id), facts.basis, event, changes)
                    .refusing(schema_refusal),
            ),
        })
    }

    /// Everything placement needs, in one statement: whether the node and a VM of this id
    /// exist, which requested units are the node's, the running VMs on them, the reservations
    /// that claim them, and what the write is made on. `None` if there is no such node.
    fn placement_facts(
        &self,
        node_id: &str,
        vm_id: &str,
        unit_ids: &[String],
        org_id: &str,
        now: Timestamp,
    ) -> Result<Option<PlacementFacts>> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT (SELECT 1 FROM vms WHERE id = ?2) AS vm_exists, \
                 (SELECT 1 FROM orgs WHERE id = ?5) AS org_here, \
                 (SELECT json_group_array(unit_id) FROM node_units \
                   WHERE node_id = ?1 AND unit_id IN (SELECT value FROM json_each(?3))) AS on_node, \
                 (SELECT json_group_array(json_array(vu.unit_id, vu.vm_id, v.terminates_at, \
                     v.interruption_reason, v.interruption_reservation_id)) \
                   FROM vm_units vu JOIN vms v ON v.id = vu.vm_id \
                   WHERE vu.node_id = ?1 AND vu.running = 1 \
                     AND vu.unit_id IN (SELECT value FROM json_each(?3))) AS running, \
                 (SELECT json_group_array(json_object('unitId', ru.unit_id, 'id', r.id, \
                     'state', r.state, 'startsAt', r.starts_at, 'endsAt', r.ends_at, \
                     'released', ru.released, 'releasedUntil', ru.released_until, \
                     'allowedOrgIds', json(r.allowed_org_ids), \
                     'managingOrgIds', json(r.managing_org_ids))) \
                   FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id \
                   WHERE ru.node_id = ?1 AND r.state <> 'cancelled' \
                     AND ru.unit_id IN (SELECT value FROM json_each(?3))) AS claims, \
                 n.owner_org_id AS owner_org_id, {} \
                 FROM nodes n WHERE n.id = ?1",
                // What placement reads: the node, the VM's id, the requested units (the VMs
                // on them, their claims and releases), the reservations claiming them and
                // the VMs running there.
                basis_column(
                    "?4",
                    &format!(
                        "SELECT {} AS fact UNION ALL SELECT {} \
                         UNION ALL SELECT {} FROM json_each(?3) \
                         UNION ALL SELECT DISTINCT {} FROM reservation_units \
                           WHERE node_id = ?1 AND unit_id IN (SELECT value FROM json_each(?3)) \
                         UNION ALL SELECT {} FROM vm_units \
                           WHERE node_id = ?1 AND running = 1 \
                             AND unit_id IN (SELECT value FROM json_each(?3))",
                        Fact::node("?1"),
                        Fact::vm("?1", "?2"),
                        Fact::unit("?1", "value"),
                        Fact::reservation("?1", "reservation_id"),
                        Fact::vm("?1", "vm_id"),
                    )
                )
            ),
            &[
                text(node_id),
                text(vm_id),
                json_list(unit_ids),
                text(&node_chain(node_id)),
                text(org_id),
            ],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        let owner = row.text("owner_org_id")?;
        let on_node: BTreeSet<String> = row.json("on_node")?;
        type RunningRow = (String, String, Option<i64>, Option<String>, Option<String>);
        let running: Vec<RunningRow> = row.json("running")?;
        let mut running_vms: BTreeMap<String, String> = BTreeMap::new();
        let mut notices: BTreeMap<String, VmNotice> = BTreeMap::new();
        let mut ended: Vec<(String, TerminationReason, Timestamp)> = Vec::new();
        for (unit_id, vm_id, terminates_at, reason, reservation_id) in running {
            let deadline = terminates_at.map(from_millis);
            if !vm_running_at(deadline, now) {
                let reason = InterruptionReason::parse(reason.as_deref().unwrap_or_default())
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
                        reservation_id: reservation_id.unwrap_or_default(),
                    },
                );
            }
            running_vms.insert(unit_id, vm_id);
        }
        let mut claims_by_unit: BTreeMap<String, Vec<UnitClaim>> = BTreeMap::new();
        let mut release_ends: BTreeMap<String, (Timestamp, String)> = BTreeMap::new();
        let mut capacity_managers = BTreeSet::new();
        for claim in row.json::<Vec<ClaimRow>>("claims")? {
            let stored = StoredState::parse(&claim.state).ok_or_else(|| {
                StorageError::Other(format!("unknown reservation state {:?}", claim.state).into())
            })?;
            let term = Term {
                starts_at: from_millis(claim.starts_at),
                ends_at: claim.ends_at.map(from_millis),
            };
            let mut party_org_ids = claim.managing_org_ids.clone();
            party_org_ids.push(owner.clone());
            party_org_ids.extend(claim.allowed_org_ids.iter().cloned());
            let status = derive_status(stored, &term, now);
            let until = claim.released_until.map(from_millis);
            let released = released_at(claim.released != 0, until, now);
            if let (true, Some(until), Status::Active) = (released, until, status) {
                release_ends.insert(claim.unit_id.clone(), (until, claim.id.clone()));
            }
            // Owners and managing orgs of the live reservations whose term covers now: the
            // orgs that may see and stop spot VMs there.
            if stored == StoredState::Live && term.contains(now) {
                capacity_managers.insert(owner.clone());
                capacity_managers.extend(claim.managing_org_ids.iter().cloned());
            }
            claims_by_unit
                .entry(claim.unit_id)
                .or_default()
                .push(UnitClaim {
                    reservation_id: claim.id,
                    status,
                    released,
                    allowed_org_ids: claim.allowed_org_ids,
                    party_org_ids,
                });
        }
        Ok(Some(PlacementFacts {
            vm_exists: !matches!(row.value("vm_exists")?, SqlValue::Null),
            org_here: !matches!(row.value("org_here")?, SqlValue::Null),
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
            capacity_managers,
            basis: read_basis(&row)?,
        }))
    }

    /// A VM as the clock sees it at `now`, the orgs managing the capacity it sits on (what
    /// decides who sees and stops it) and what the write is made on, in one statement.
    fn vm_facts(&self, id: &str, now: Timestamp) -> Result<VmFacts> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT {VM_COLUMNS}, {VM_UNIT_IDS_COLUMN}, \
                 (SELECT json_group_array(json_array(n.owner_org_id, json(r.managing_org_ids), \
                     r.starts_at, r.ends_at, r.created_at)) \
                   FROM reservations r JOIN nodes n ON n.id = r.node_id \
                   WHERE r.state = 'live' AND r.id IN (SELECT ru.reservation_id \
                     FROM vm_units vu JOIN reservation_units ru \
                       ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
                     WHERE vu.vm_id = v.id)) AS managers, \
                 {} FROM vms v WHERE v.id = ?1",
                // What a termination reads: the VM, its node (the owner) and the
                // reservations holding its units (their managers).
                basis_column(
                    "'node:' || v.node_id",
                    &format!(
                        "SELECT {} AS fact UNION ALL SELECT {} \
                         UNION ALL SELECT DISTINCT {} FROM vm_units vu JOIN reservation_units ru \
                           ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
                         WHERE vu.vm_id = v.id",
                        Fact::vm("v.node_id", "v.id"),
                        Fact::node("v.node_id"),
                        Fact::reservation("v.node_id", "ru.reservation_id"),
                    )
                )
            ),
            &[text(id)],
        )?;
        let row = first_row(&result).ok_or(DomainError::NotFound { what: "VM" })?;
        let mut vm = read_vm_row(&row)?;
        vm.unit_ids = row.json("vm_unit_ids")?;
        let vm = vm.at(now);
        let mut managers = BTreeSet::new();
        for (owner, managing, starts_at, ends_at, created_at) in
            row.json::<Vec<(String, Vec<String>, i64, Option<i64>, i64)>>("managers")?
        {
            let term = Term {
                starts_at: from_millis(starts_at),
                ends_at: ends_at.map(from_millis),
            };
            // A reservation made after the VM was gone never held the VM's capacity.
            let ran_while_held = vm
                .terminated_at
                .is_none_or(|ended| ended > from_millis(created_at));
            if term.contains(now) && ran_while_held {
                managers.insert(owner);
                managers.extend(managing);
            }
        }
        Ok(VmFacts {
            vm,
            capacity_managers: managers.into_iter().collect(),
            basis: read_basis(&row)?,
        })
    }

    /// A VM the caller may read.
    pub fn read_vm(&self, ctx: &Context<'_>, id: &str) -> Result<Vm> {
        let VmFacts {
            vm,
            capacity_managers: managers,
            ..
        } = self.vm_facts(id, ctx.now)?;
        let parties = vm_parties(&vm, &managers);
        may_read_vm(ctx.caller, &parties).enforce("VM", "reading VMs needs vm.read")?;
        Ok(vm)
    }

    /// VMs the caller may read: its own org's, and those on units of active reservations it
    /// owns or manages that were made before the VM was gone (operators: all). Ordered by id.
    ///
    /// An org's page costs what it may see, not the platform's VMs: its own from the cursor
    /// on (`vms_by_org_and_id`), and the VMs on the units of the reservations it owns or
    /// manages (walked from the reservations, `CROSS JOIN` keeping that order), each part cut
    /// at a page before they are merged.
    pub fn list_vms(&self, ctx: &Context<'_>, filter: &VmFilter) -> Result<Page<Vm>> {
        if !ctx
            .caller
            .has(reservations_domain::access::Permission::VmRead)
        {
            return Err(DomainError::Forbidden("listing VMs needs vm.read".into()).into());
        }
        let limit = filter.limit.clamp(1, MAX_VM_PAGE);
        let org = ctx.caller.org_id.clone();
        // The cursor and the filters, on the VM aliased `vm`.
        let wanted = |vm: &str| {
            format!(
                "{vm}.id > ?1 AND (?2 IS NULL OR {vm}.node_id = ?2) AND (?3 IS NULL OR {} = ?3)",
                derived_status_sql(vm, "?5")
            )
        };
        let visible = if org.is_none() {
            String::new()
        } else {
            format!(
                "AND v.id IN ( \
                   SELECT * FROM (SELECT o.id FROM vms o INDEXED BY vms_by_org_and_id \
                     WHERE o.org_id = ?4 AND {own} ORDER BY o.id LIMIT ?6) \
                   UNION \
                   SELECT * FROM (SELECT m.id FROM reservations r \
                     CROSS JOIN reservation_units ru ON ru.reservation_id = r.id \
                     CROSS JOIN vm_units vu ON vu.node_id = ru.node_id AND vu.unit_id = ru.unit_id \
                     CROSS JOIN vms m ON m.id = vu.vm_id \
                     WHERE r.state = 'live' AND r.starts_at <= ?5 \
                       AND (r.ends_at IS NULL OR r.ends_at > ?5) \
                       AND (r.node_id IN (SELECT id FROM nodes WHERE owner_org_id = ?4) \
                         OR EXISTS (SELECT 1 FROM json_each(CASE WHEN json_valid(r.managing_org_ids) THEN r.managing_org_ids ELSE '[]' END) WHERE value = ?4)) \
                       AND r.created_at < COALESCE(m.terminated_at, m.terminates_at, 9223372036854775807) \
                       AND {managed} ORDER BY m.id LIMIT ?6))",
                own = wanted("o"),
                managed = wanted("m"),
            )
        };
        let result = exec(
            self.db(),
            &format!(
                "SELECT {VM_COLUMNS}, {VM_UNIT_IDS_COLUMN} FROM vms v \
                 WHERE {} {visible} ORDER BY v.id LIMIT ?6",
                wanted("v")
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
        let listed = rows(&result)
            .map(|r| {
                read_listed(&r, "id", |r| {
                    let mut vm = read_vm_row(r)?;
                    vm.unit_ids = r.json("vm_unit_ids")?;
                    Ok(vm.at(ctx.now))
                })
            })
            .collect();
        Ok(Page::from_overfetched_rows(listed, limit, |v| v.id.clone()))
    }

    /// Terminates a VM: its org, an operator, or — for a spot VM on reserved units — the
    /// units' capacity managers holding `reservation.capacity`.
    pub fn terminate_vm(&self, ctx: &Context<'_>, id: &str) -> Result<Vm> {
        self.carry_out(ctx, || self.plan_terminate_vm(ctx, id))
    }

    /// The plan of [`Capacity::terminate_vm`] from fresh facts.
    pub fn plan_terminate_vm(&self, ctx: &Context<'_>, id: &str) -> Result<Planned<Vm>> {
        let VmFacts {
            vm,
            capacity_managers: managers,
            basis,
        } = self.vm_facts(id, ctx.now)?;
        let parties = vm_parties(&vm, &managers);
        may_terminate_vm(ctx.caller, &parties).enforce(
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
        let changes = Changes {
            ended_vms: vec![EndedVm {
                id: vm.id.clone(),
                reason: reason.as_str(),
                at: ctx.now.timestamp_millis(),
            }],
            ..Changes::default()
        };
        // The capacity managers are principals; the VM's org, when another org stopped its
        // VM, learns only that its VM was terminated (see `reservations_domain::audit`).
        let event = NewEvent {
            action: "vm.terminate",
            node_id: Some(vm.node_id.clone()),
            vm_id: Some(vm.id.clone()),
            org_id: Some(vm.org_id.clone()),
            unit_ids: vm.unit_ids.clone(),
            terminated: vec![vm.id.clone()],
            reason: Some(reason.as_str().to_owned()),
            visible_to: managers.clone(),
            affected_vms: vec![AffectedVm {
                vm_id: vm.id.clone(),
                org_id: vm.org_id.clone(),
                unit_ids: vm.unit_ids.clone(),
            }],
            ..NewEvent::default()
        };
        let chain = node_chain(&vm.node_id);
        Ok(Planned {
            outcome: Vm {
                status: VmStatus::Terminated,
                termination_reason: Some(reason),
                terminated_at: Some(ctx.now),
                ..vm
            },
            write: Some(Write::new(chain, basis, event, changes)),
        })
    }
}

/// What [`Capacity::vm_facts`] reads.
struct VmFacts {
    vm: Vm,
    capacity_managers: Vec<String>,
    basis: Basis,
}

/// A reservation claiming a requested unit, as [`Capacity::placement_facts`] reads it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimRow {
    unit_id: String,
    id: String,
    state: String,
    starts_at: i64,
    ends_at: Option<i64>,
    released: i64,
    released_until: Option<i64>,
    allowed_org_ids: Vec<String>,
    managing_org_ids: Vec<String>,
}

/// What placement reads about the requested units.
struct PlacementFacts {
    vm_exists: bool,
    /// Whether this cell has the placing org (a cell other than the directory's copies an
    /// org the first time one of its rows names it).
    org_here: bool,
    units: Vec<UnitFacts>,
    /// Running VMs on them under notice.
    notices: BTreeMap<String, VmNotice>,
    /// VMs on them whose notice ran out, not yet written down: id, why, when.
    ended: Vec<(String, TerminationReason, Timestamp)>,
    /// Units released only until a time, by an active reservation: when, and which.
    release_ends: BTreeMap<String, (Timestamp, String)>,
    /// Owners and managing orgs of the active reservations holding the units.
    capacity_managers: BTreeSet<String>,
    basis: Basis,
}

fn vm_parties<'a>(vm: &'a Vm, managers: &'a [String]) -> VmParties<'a> {
    VmParties {
        vm_org: &vm.org_id,
        is_spot: vm.tier == Tier::Spot,
        capacity_managers: managers,
    }
}

/// Maps the schema's own placement guards to the refusal the rules would have given.
fn schema_refusal(error: &StorageError, changes: &Changes) -> Option<StoreError> {
    let vm = changes.vms.first()?;
    let reason = match Guard::of(error)? {
        Guard::VmIdTaken => {
            return Some(StoreError::Domain(DomainError::AlreadyExists {
                what: "VM",
                id: vm.id.clone(),
            }));
        }
        Guard::UnitBusy => RefusalReason::UnitBusy,
        Guard::ReleasedSpotOnly => RefusalReason::ReleasedSpotOnly,
        _ => return None,
    };
    let unit_ids = &vm.unit_ids;
    Some(StoreError::Domain(DomainError::PlacementRefused {
        refusals: unit_ids
            .iter()
            .map(|unit_id| UnitRefusal::new(unit_id.clone(), reason))
            .collect(),
    }))
}
