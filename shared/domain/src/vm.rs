//! Workloads: VMs of one org on one or more units of one node.

use serde::{Deserialize, Serialize};

use crate::notice::{Interruption, InterruptionReason, vm_running_at};
use crate::{NodeId, OrgId, Timestamp, UnitId, VmId};

/// The market tier a VM is bought at. Only spot VMs may sit on released units, and only
/// spot VMs are terminated by a reclaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    Spot,
    Community,
    Verified,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Spot, Tier::Community, Tier::Verified];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Spot => "spot",
            Tier::Community => "community",
            Tier::Verified => "verified",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmStatus {
    Running,
    Terminated,
}

impl VmStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            VmStatus::Running => "running",
            VmStatus::Terminated => "terminated",
        }
    }

    pub fn parse(s: &str) -> Option<VmStatus> {
        [VmStatus::Running, VmStatus::Terminated]
            .into_iter()
            .find(|status| status.as_str() == s)
    }
}

/// Why a VM stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TerminationReason {
    /// Its own org stopped it.
    Stopped,
    /// The capacity owner (node owner or a managing org) terminated a spot VM on its units.
    TerminatedByCapacityOwner,
    /// A reclaim took its units back.
    Reclaimed,
    /// A platform operator stopped it.
    StoppedByOperator,
    /// The release it ran on ended (`until`).
    ReleaseEnded,
}

impl TerminationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::Stopped => "stopped",
            TerminationReason::TerminatedByCapacityOwner => "terminated-by-capacity-owner",
            TerminationReason::Reclaimed => "reclaimed",
            TerminationReason::StoppedByOperator => "stopped-by-operator",
            TerminationReason::ReleaseEnded => "release-ended",
        }
    }

    pub fn parse(s: &str) -> Option<TerminationReason> {
        [
            TerminationReason::Stopped,
            TerminationReason::TerminatedByCapacityOwner,
            TerminationReason::Reclaimed,
            TerminationReason::StoppedByOperator,
            TerminationReason::ReleaseEnded,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Vm {
    pub id: VmId,
    pub org_id: OrgId,
    pub node_id: NodeId,
    pub unit_ids: Vec<UnitId>,
    pub tier: Tier,
    pub status: VmStatus,
    pub termination_reason: Option<TerminationReason>,
    pub created_at: Timestamp,
    pub terminated_at: Option<Timestamp>,
    /// Its notice, if it was given one (kept after it stopped, to say why).
    pub interruption: Option<Interruption>,
}

impl Vm {
    /// The VM as the clock sees it at `now`: a running VM whose notice ran out stopped at its
    /// `terminatesAt`, for the reason of its notice.
    pub fn at(mut self, now: Timestamp) -> Vm {
        if self.status == VmStatus::Running
            && let Some(interruption) = &self.interruption
            && !vm_running_at(Some(interruption.terminates_at), now)
        {
            self.status = VmStatus::Terminated;
            self.termination_reason = Some(termination_for(interruption.reason));
            self.terminated_at = Some(interruption.terminates_at);
        }
        self
    }
}

/// Why a VM stopped when its notice ran out.
pub fn termination_for(reason: InterruptionReason) -> TerminationReason {
    match reason {
        InterruptionReason::Reclaimed => TerminationReason::Reclaimed,
        InterruptionReason::ReleaseEnds => TerminationReason::ReleaseEnded,
    }
}

/// A running VM that touches the units a capacity operation names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningVm {
    pub id: VmId,
    pub org_id: OrgId,
    pub tier: Tier,
    pub unit_ids: Vec<UnitId>,
    /// The deadline of a VM under notice: it stops by itself then.
    pub terminates_at: Option<Timestamp>,
}
