//! Who may do what: permissions, roles, callers, and the authorization decisions.
//!
//! Every decision is a pure function of the caller and of the ownership facts of the
//! object acted on, so the whole policy can be read (and tested) as a table.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{DomainError, OrgId};

/// A single capability an API key may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    #[serde(rename = "node.read")]
    NodeRead,
    #[serde(rename = "node.write")]
    NodeWrite,
    #[serde(rename = "reservation.read")]
    ReservationRead,
    #[serde(rename = "reservation.write")]
    ReservationWrite,
    #[serde(rename = "reservation.capacity")]
    ReservationCapacity,
    #[serde(rename = "vm.read")]
    VmRead,
    #[serde(rename = "vm.write")]
    VmWrite,
    #[serde(rename = "audit.read")]
    AuditRead,
    #[serde(rename = "apikey.manage")]
    ApikeyManage,
}

impl Permission {
    pub const ALL: [Permission; 9] = [
        Permission::NodeRead,
        Permission::NodeWrite,
        Permission::ReservationRead,
        Permission::ReservationWrite,
        Permission::ReservationCapacity,
        Permission::VmRead,
        Permission::VmWrite,
        Permission::AuditRead,
        Permission::ApikeyManage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::NodeRead => "node.read",
            Permission::NodeWrite => "node.write",
            Permission::ReservationRead => "reservation.read",
            Permission::ReservationWrite => "reservation.write",
            Permission::ReservationCapacity => "reservation.capacity",
            Permission::VmRead => "vm.read",
            Permission::VmWrite => "vm.write",
            Permission::AuditRead => "audit.read",
            Permission::ApikeyManage => "apikey.manage",
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Permission {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Permission::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or(())
    }
}

/// A named bundle of permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Everything the org can do.
    Admin,
    /// Runs the org's capacity: nodes, reservations, release/reclaim, audit.
    CapacityManager,
    /// Uses capacity: places and stops VMs, reads what it uses.
    Member,
    /// Reads only.
    Viewer,
}

impl Role {
    pub const ALL: [Role; 4] = [
        Role::Admin,
        Role::CapacityManager,
        Role::Member,
        Role::Viewer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::CapacityManager => "capacity-manager",
            Role::Member => "member",
            Role::Viewer => "viewer",
        }
    }

    /// The permissions the role bundles. This is the table the README documents.
    pub fn permissions(self) -> BTreeSet<Permission> {
        use Permission::*;
        let granted: &[Permission] = match self {
            Role::Admin => &Permission::ALL,
            Role::CapacityManager => &[
                NodeRead,
                NodeWrite,
                ReservationRead,
                ReservationWrite,
                ReservationCapacity,
                VmRead,
                AuditRead,
            ],
            Role::Member => &[NodeRead, ReservationRead, VmRead, VmWrite],
            Role::Viewer => &[NodeRead, ReservationRead, VmRead],
        };
        granted.iter().copied().collect()
    }
}

impl FromStr for Role {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or(())
    }
}

/// A key's explicit permission list as it is given: known names, no repeats, and only
/// permissions its role has (a list narrows a role, it never widens it).
pub fn permission_list(role: Role, names: &[String]) -> Result<Vec<Permission>, DomainError> {
    let bundled = role.permissions();
    let mut permissions = Vec::with_capacity(names.len());
    for name in names {
        let permission: Permission = name.parse().map_err(|()| {
            DomainError::invalid("permissions", format!("unknown permission {name:?}"))
        })?;
        if !bundled.contains(&permission) {
            return Err(DomainError::invalid(
                "permissions",
                format!(
                    "role {} does not include {name}; a permission list may only narrow the role",
                    role.as_str()
                ),
            ));
        }
        if permissions.contains(&permission) {
            return Err(DomainError::invalid(
                "permissions",
                format!("{name} is listed twice"),
            ));
        }
        permissions.push(permission);
    }
    Ok(permissions)
}

/// The effective permissions of a key: its role's, narrowed to an explicit list if it has one.
/// An explicit list can only narrow a role, never widen it.
pub fn effective_permissions(role: Role, explicit: Option<&[Permission]>) -> BTreeSet<Permission> {
    let bundled = role.permissions();
    match explicit {
        None => bundled,
        Some(list) => list
            .iter()
            .copied()
            .filter(|p| bundled.contains(p))
            .collect(),
    }
}

/// Who is calling: an operator (above all orgs) or a key of one org.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub key_id: String,
    /// `None` for a platform operator.
    pub org_id: Option<OrgId>,
    pub permissions: BTreeSet<Permission>,
}

impl Caller {
    pub fn operator(key_id: impl Into<String>) -> Caller {
        Caller {
            key_id: key_id.into(),
            org_id: None,
            permissions: Permission::ALL.into_iter().collect(),
        }
    }

    pub fn is_operator(&self) -> bool {
        self.org_id.is_none()
    }

    pub fn has(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }

    /// Whether the key may change anything at all (a read-only key may not).
    pub fn may_write(&self) -> bool {
        use Permission::*;
        [
            NodeWrite,
            ReservationWrite,
            ReservationCapacity,
            VmWrite,
            ApikeyManage,
        ]
        .into_iter()
        .any(|p| self.has(p))
    }

    pub fn is_org(&self, org: &str) -> bool {
        self.org_id.as_deref() == Some(org)
    }

    fn is_any_of(&self, orgs: &[OrgId]) -> bool {
        self.org_id
            .as_deref()
            .is_some_and(|mine| orgs.iter().any(|o| o == mine))
    }
}

/// The permissions a caller can actually exercise, as `GET /v1/whoami` lists them: an
/// operator holds every permission except `vm.write` (it has no org to place VMs for, so
/// [`may_place_vm`] refuses it; it terminates VMs as an operator, not by `vm.write`).
pub fn usable_permissions(caller: &Caller) -> BTreeSet<Permission> {
    caller
        .permissions
        .iter()
        .copied()
        .filter(|p| !(caller.is_operator() && *p == Permission::VmWrite))
        .collect()
}

/// The answer to "may this caller do this?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Answer as if the object did not exist: the caller may not even learn that it does.
    NotFound,
    /// The caller can see the object but may not do this to it.
    Forbidden,
}

impl Decision {
    pub fn is_allowed(self) -> bool {
        self == Decision::Allow
    }

    /// The decision as the refusal a caller gets: `NotFound` names `what` is missing,
    /// `Forbidden` says `why`.
    pub fn enforce(self, what: &'static str, why: &'static str) -> Result<(), DomainError> {
        match self {
            Decision::Allow => Ok(()),
            Decision::NotFound => Err(DomainError::NotFound { what }),
            Decision::Forbidden => Err(DomainError::Forbidden(why.into())),
        }
    }
}

/// The ownership facts of a reservation that decisions depend on.
#[derive(Debug, Clone, Copy)]
pub struct ReservationParties<'a> {
    pub node_owner: &'a str,
    pub allowed_org_ids: &'a [OrgId],
    pub managing_org_ids: &'a [OrgId],
}

impl ReservationParties<'_> {
    /// Operators, the node's owner, managing orgs and the audience can see a reservation.
    fn visible_to(&self, caller: &Caller) -> bool {
        caller.is_operator()
            || caller.is_org(self.node_owner)
            || caller.is_any_of(self.managing_org_ids)
            || caller.is_any_of(self.allowed_org_ids)
    }

    /// Operators, the node's owner and managing orgs may release, reclaim and terminate
    /// spot workloads. Being in the audience does not confer this.
    fn manages(&self, caller: &Caller) -> bool {
        caller.is_operator()
            || caller.is_org(self.node_owner)
            || caller.is_any_of(self.managing_org_ids)
    }
}

/// Read a reservation.
pub fn may_read_reservation(caller: &Caller, parties: ReservationParties<'_>) -> Decision {
    if !parties.visible_to(caller) {
        return Decision::NotFound;
    }
    if !caller.has(Permission::ReservationRead) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// List a node's reservations: keys with `reservation.read`. Which reservations a listing
/// shows is then decided one by one by [`may_read_reservation`].
pub fn may_list_reservations(caller: &Caller) -> Decision {
    if caller.has(Permission::ReservationRead) {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Release, reclaim or dry-run a reservation's units.
///
/// A key without `reservation.capacity` gets the same answer as for a reservation that does
/// not exist, and so does a caller who cannot see the reservation at all.
pub fn may_manage_capacity(caller: &Caller, parties: ReservationParties<'_>) -> Decision {
    if !caller.has(Permission::ReservationCapacity) || !parties.visible_to(caller) {
        return Decision::NotFound;
    }
    if !parties.manages(caller) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Create a reservation on a node, or cancel one: operators and the node's owner org.
pub fn may_write_reservation(caller: &Caller, node_owner: &str) -> Decision {
    if !(caller.is_operator() || caller.is_org(node_owner)) {
        return Decision::NotFound;
    }
    if !caller.has(Permission::ReservationWrite) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Re-affirm a `needs-review` reservation: operators only.
pub fn may_reaffirm_reservation(caller: &Caller, parties: ReservationParties<'_>) -> Decision {
    if !parties.visible_to(caller) {
        return Decision::NotFound;
    }
    if !caller.is_operator() {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Read a node: nodes are the market's listings, visible to every key with `node.read`.
pub fn may_read_node(caller: &Caller) -> Decision {
    if caller.has(Permission::NodeRead) {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Register a node (`existing_owner` is `None`) or update one.
///
/// Registering and changing a node's owner are for operators; the owner org may update its
/// node's units with `node.write`.
pub fn may_write_node(
    caller: &Caller,
    existing_owner: Option<&str>,
    requested_owner: &str,
) -> Decision {
    if caller.is_operator() {
        return Decision::Allow;
    }
    let Some(owner) = existing_owner else {
        return Decision::Forbidden;
    };
    if !caller.is_org(owner) {
        return Decision::Forbidden;
    }
    if !caller.has(Permission::NodeWrite) || owner != requested_owner {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Manage an org's API keys (create, list, revoke): operators, or a key of that org with
/// `apikey.manage`. Other orgs are told the org does not exist, so that org ids cannot be
/// probed.
pub fn may_manage_keys(caller: &Caller, org: &str) -> Decision {
    if caller.is_operator() {
        return Decision::Allow;
    }
    if !caller.is_org(org) {
        return Decision::NotFound;
    }
    if !caller.has(Permission::ApikeyManage) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Create a key of `org` holding `granted`: whoever manages the org's keys, and never more
/// than the issuing key holds itself, so a key narrowed to `apikey.manage` cannot mint a
/// wider one.
pub fn may_issue_key(caller: &Caller, org: &str, granted: &BTreeSet<Permission>) -> Decision {
    may_act_on_key(caller, org, granted)
}

/// Revoke a key of `org` holding `held`: the same rule as issuing one, so a key narrowed to
/// `apikey.manage` cannot revoke (and so lock out) a key stronger than itself.
pub fn may_revoke_key(caller: &Caller, org: &str, held: &BTreeSet<Permission>) -> Decision {
    may_act_on_key(caller, org, held)
}

fn may_act_on_key(caller: &Caller, org: &str, key_permissions: &BTreeSet<Permission>) -> Decision {
    match may_manage_keys(caller, org) {
        Decision::Allow if !key_permissions.is_subset(&caller.permissions) => Decision::Forbidden,
        decision => decision,
    }
}

/// Read an org: operators and the org's own keys.
pub fn may_read_org(caller: &Caller, org: &str) -> Decision {
    if caller.is_operator() || caller.is_org(org) {
        Decision::Allow
    } else {
        Decision::NotFound
    }
}

/// Create orgs: operators only.
pub fn may_create_org(caller: &Caller) -> Decision {
    if caller.is_operator() {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Create, list and revoke operator keys: operators only. An org key is told the API exists
/// (forbidden, not hidden): operator keys belong to no org whose existence could leak.
pub fn may_manage_operator_keys(caller: &Caller) -> Decision {
    if caller.is_operator() {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Place a VM for the caller's own org.
pub fn may_place_vm(caller: &Caller) -> Decision {
    if caller.is_operator() {
        // Operators have no org to run a workload for.
        return Decision::Forbidden;
    }
    if !caller.has(Permission::VmWrite) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// The facts about a VM that decide who may see and stop it.
#[derive(Debug, Clone)]
pub struct VmParties<'a> {
    pub vm_org: &'a str,
    pub is_spot: bool,
    /// Owners and managing orgs of the active reservations the VM's units belong to,
    /// plus the node's owner when the VM sits on reserved units.
    pub capacity_managers: &'a [OrgId],
}

/// Read a VM: the VM's org, operators, and the capacity managers of the units it sits on.
pub fn may_read_vm(caller: &Caller, vm: &VmParties<'_>) -> Decision {
    let visible =
        caller.is_operator() || caller.is_org(vm.vm_org) || caller.is_any_of(vm.capacity_managers);
    if !visible {
        return Decision::NotFound;
    }
    if !caller.has(Permission::VmRead) {
        return Decision::Forbidden;
    }
    Decision::Allow
}

/// Terminate a VM: the VM's org (`vm.write`), operators, or — for a spot VM on reserved
/// units — the node owner and managing orgs holding `reservation.capacity` (also when the
/// spot VM is their own org's: the same key's reclaim would terminate it).
pub fn may_terminate_vm(caller: &Caller, vm: &VmParties<'_>) -> Decision {
    if caller.is_operator() {
        return Decision::Allow;
    }
    let own = caller.is_org(vm.vm_org);
    let manages = caller.is_any_of(vm.capacity_managers);
    if own && caller.has(Permission::VmWrite) {
        return Decision::Allow;
    }
    if manages && vm.is_spot && caller.has(Permission::ReservationCapacity) {
        return Decision::Allow;
    }
    if own || (manages && caller.has(Permission::VmRead)) {
        Decision::Forbidden
    } else {
        Decision::NotFound
    }
}

/// Read the audit trail: keys with `audit.read` (operators see everything, orgs the events
/// on their own nodes and reservations — the filtering is the store's job).
pub fn may_read_audit(caller: &Caller) -> Decision {
    if caller.has(Permission::AuditRead) {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Read the events feed (`GET /v1/events`): a key that may read the audit trail, its org's
/// VMs or its org's reservations. What it then sees of each event is the audit trail's one
/// rule ([`crate::audit::event_view`]): a VM's org sees its VMs' placements, notices and
/// terminations, a reservation's parties its releases and reclaims.
pub fn may_read_events(caller: &Caller) -> Decision {
    if [
        Permission::AuditRead,
        Permission::VmRead,
        Permission::ReservationRead,
    ]
    .into_iter()
    .any(|p| caller.has(p))
    {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// Verify the audit chain: operators only.
pub fn may_verify_audit(caller: &Caller) -> Decision {
    if caller.is_operator() {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}
