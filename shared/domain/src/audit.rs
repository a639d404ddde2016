//! Who sees what of an audit event: need to know.
//!
//! An event has two kinds of parties:
//! - **principals**, who see all of it: the acting org, and the orgs the object belongs to or
//!   is shared with (a reservation's owner, managing orgs and audience; a key's org…);
//! - **affected VM owners**, orgs whose VMs the event terminated without being principals
//!   (a spot buyer whose VM a reclaim took back). They learn that *their* VMs were terminated
//!   — when, which VMs, on which units of which node — and nothing about the reservation,
//!   its parties, the actor, the reason, or other orgs' VMs.
//!
//! Operators see everything; everyone else sees nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::access::Caller;
use crate::{OrgId, UnitId, VmId};

/// The part of an event that concerns one org's VMs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmOwnerShare {
    pub org_id: OrgId,
    pub vm_ids: Vec<VmId>,
    pub unit_ids: Vec<UnitId>,
}

/// A VM an event terminated, with its org and units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffectedVm {
    pub vm_id: VmId,
    pub org_id: OrgId,
    pub unit_ids: Vec<UnitId>,
}

/// Who may see an event, and how much of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventAudience {
    /// Sorted, without repeats.
    pub principals: Vec<OrgId>,
    /// One share per affected org that is not a principal, sorted by org.
    pub vm_owners: Vec<VmOwnerShare>,
}

impl EventAudience {
    /// The audience of an event acted by `actor_org` (none for operators), shared with
    /// `principals`, that terminated `affected` VMs.
    pub fn new(
        actor_org: Option<&str>,
        principals: impl IntoIterator<Item = OrgId>,
        affected: &[AffectedVm],
    ) -> EventAudience {
        let mut principals: Vec<OrgId> = principals
            .into_iter()
            .chain(actor_org.map(str::to_owned))
            .collect();
        principals.sort();
        principals.dedup();
        let mut shares: BTreeMap<&str, VmOwnerShare> = BTreeMap::new();
        for vm in affected {
            if principals.binary_search(&vm.org_id).is_ok() {
                continue;
            }
            let share = shares
                .entry(vm.org_id.as_str())
                .or_insert_with(|| VmOwnerShare {
                    org_id: vm.org_id.clone(),
                    vm_ids: Vec::new(),
                    unit_ids: Vec::new(),
                });
            share.vm_ids.push(vm.vm_id.clone());
            share.unit_ids.extend(vm.unit_ids.iter().cloned());
        }
        let vm_owners = shares
            .into_values()
            .map(|mut share| {
                share.vm_ids.sort();
                share.vm_ids.dedup();
                share.unit_ids.sort();
                share.unit_ids.dedup();
                share
            })
            .collect();
        EventAudience {
            principals,
            vm_owners,
        }
    }
}

/// How much of an event a caller sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventView<'a> {
    /// All of it.
    Full,
    /// Only that these VMs of its own were terminated, on these units.
    OwnVms(&'a VmOwnerShare),
    /// Nothing: the event is not listed.
    Hidden,
}

/// The one rule for what a caller sees of an event.
pub fn event_view<'a>(caller: &Caller, audience: &'a EventAudience) -> EventView<'a> {
    let Some(org) = caller.org_id.as_deref() else {
        return EventView::Full;
    };
    if audience.principals.iter().any(|p| p == org) {
        return EventView::Full;
    }
    match audience.vm_owners.iter().find(|share| share.org_id == org) {
        Some(share) => EventView::OwnVms(share),
        None => EventView::Hidden,
    }
}
