//! The authorization policy as a table: action × who × key → Allow / NotFound / Forbidden.
//!
//! The fixture world:
//! - node `n1` is owned by org `owner`;
//! - its reservation has `managingOrgIds = [mgr]` and `allowedOrgIds = [aud]` (the audience);
//! - the VM acted on belongs to the audience org `aud` and sits on that reservation's units,
//!   whose capacity managers are `owner` and `mgr`;
//! - `stranger` is an org with no part in any of it.
//!
//! Who reads: NotFound when the caller may not even learn that the object exists,
//! Forbidden when it can see the object but may not do this to it.

use std::collections::BTreeSet;

use reservations_domain::access::{
    Caller, Decision, Permission, ReservationParties, Role, VmParties, effective_permissions,
    may_create_org, may_issue_key, may_list_reservations, may_manage_capacity, may_manage_keys,
    may_manage_operator_keys, may_place_vm, may_read_audit, may_read_node, may_read_org,
    may_read_reservation, may_read_vm, may_reaffirm_reservation, may_revoke_key, may_terminate_vm,
    may_verify_audit, may_write_node, may_write_reservation, usable_permissions,
};

use Decision::{Allow, Forbidden, NotFound};

const OWNER: &str = "owner";
const MGR: &str = "mgr";
const AUD: &str = "aud";
const STRANGER: &str = "stranger";

/// Every `may_*` decision, applied to the fixture world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    ReadReservation,
    /// Release, reclaim and dry run.
    ManageCapacity,
    /// Create or cancel a reservation on the owner's node.
    WriteReservation,
    ReaffirmReservation,
    ReadNode,
    RegisterNode,
    UpdateNode,
    ChangeNodeOwner,
    /// The API keys of org `owner`.
    ManageOwnerKeys,
    /// Create an `admin` key of org `owner`.
    IssueOwnerAdminKey,
    /// Create a `viewer` key of org `owner`.
    IssueOwnerViewerKey,
    /// Revoke an `admin` key of org `owner`.
    RevokeOwnerAdminKey,
    /// Revoke a `viewer` key of org `owner`.
    RevokeOwnerViewerKey,
    /// Org `owner`.
    ReadOwnerOrg,
    CreateOrg,
    ManageOperatorKeys,
    PlaceVm,
    ReadVm,
    TerminateSpotVm,
    TerminateVerifiedVm,
    ReadAudit,
    VerifyAudit,
}

impl Action {
    const ALL: [Action; 22] = [
        Action::ReadReservation,
        Action::ManageCapacity,
        Action::WriteReservation,
        Action::ReaffirmReservation,
        Action::ReadNode,
        Action::RegisterNode,
        Action::UpdateNode,
        Action::ChangeNodeOwner,
        Action::ManageOwnerKeys,
        Action::IssueOwnerAdminKey,
        Action::IssueOwnerViewerKey,
        Action::RevokeOwnerAdminKey,
        Action::RevokeOwnerViewerKey,
        Action::ReadOwnerOrg,
        Action::CreateOrg,
        Action::ManageOperatorKeys,
        Action::PlaceVm,
        Action::ReadVm,
        Action::TerminateSpotVm,
        Action::TerminateVerifiedVm,
        Action::ReadAudit,
        Action::VerifyAudit,
    ];

    fn decide(self, caller: &Caller) -> Decision {
        let managing = [MGR.to_owned()];
        let audience = [AUD.to_owned()];
        let parties = ReservationParties {
            node_owner: OWNER,
            allowed_org_ids: &audience,
            managing_org_ids: &managing,
        };
        let capacity_managers = [OWNER.to_owned(), MGR.to_owned()];
        let vm = |is_spot| VmParties {
            vm_org: AUD,
            is_spot,
            capacity_managers: &capacity_managers,
        };
        match self {
            Action::ReadReservation => may_read_reservation(caller, parties),
            Action::ManageCapacity => may_manage_capacity(caller, parties),
            Action::WriteReservation => may_write_reservation(caller, OWNER),
            Action::ReaffirmReservation => may_reaffirm_reservation(caller, parties),
            Action::ReadNode => may_read_node(caller),
            Action::RegisterNode => may_write_node(caller, None, OWNER),
            Action::UpdateNode => may_write_node(caller, Some(OWNER), OWNER),
            Action::ChangeNodeOwner => may_write_node(caller, Some(OWNER), MGR),
            Action::ManageOwnerKeys => may_manage_keys(caller, OWNER),
            Action::IssueOwnerAdminKey => may_issue_key(caller, OWNER, &Role::Admin.permissions()),
            Action::IssueOwnerViewerKey => {
                may_issue_key(caller, OWNER, &Role::Viewer.permissions())
            }
            Action::RevokeOwnerAdminKey => {
                may_revoke_key(caller, OWNER, &Role::Admin.permissions())
            }
            Action::RevokeOwnerViewerKey => {
                may_revoke_key(caller, OWNER, &Role::Viewer.permissions())
            }
            Action::ReadOwnerOrg => may_read_org(caller, OWNER),
            Action::CreateOrg => may_create_org(caller),
            Action::ManageOperatorKeys => may_manage_operator_keys(caller),
            Action::PlaceVm => may_place_vm(caller),
            Action::ReadVm => may_read_vm(caller, &vm(false)),
            Action::TerminateSpotVm => may_terminate_vm(caller, &vm(true)),
            Action::TerminateVerifiedVm => may_terminate_vm(caller, &vm(false)),
            Action::ReadAudit => may_read_audit(caller),
            Action::VerifyAudit => may_verify_audit(caller),
        }
    }
}

/// An org's relation to the fixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    /// Owns the node.
    Owner,
    /// In `managingOrgIds`.
    Manager,
    /// In `allowedOrgIds`, and the org of the VM.
    Audience,
    Stranger,
}

impl Who {
    const ALL: [Who; 4] = [Who::Owner, Who::Manager, Who::Audience, Who::Stranger];

    fn org(self) -> &'static str {
        match self {
            Who::Owner => OWNER,
            Who::Manager => MGR,
            Who::Audience => AUD,
            Who::Stranger => STRANGER,
        }
    }
}

fn org_caller(org: &str, role: Role, explicit: Option<&[Permission]>) -> Caller {
    Caller {
        key_id: format!("key-of-{org}"),
        org_id: Some(org.to_owned()),
        permissions: effective_permissions(role, explicit),
    }
}

/// The roles, in the column order of [`ORG_TABLE`].
const ROLES: [Role; 4] = [
    Role::Admin,
    Role::CapacityManager,
    Role::Member,
    Role::Viewer,
];

/// Keys of orgs, holding a role's full bundle.
///
/// Columns: admin, capacity-manager, member, viewer.
#[rustfmt::skip]
const ORG_TABLE: &[(Action, Who, [Decision; 4])] = &[
    //                                          admin      cap-mgr    member     viewer
    (Action::ReadReservation,     Who::Owner,    [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadReservation,     Who::Manager,  [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadReservation,     Who::Audience, [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadReservation,     Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    // Without reservation.capacity: NotFound, exactly as for a reservation one cannot see.
    // The audience sees the reservation but does not manage it: Forbidden.
    (Action::ManageCapacity,      Who::Owner,    [Allow,     Allow,     NotFound,  NotFound ]),
    (Action::ManageCapacity,      Who::Manager,  [Allow,     Allow,     NotFound,  NotFound ]),
    (Action::ManageCapacity,      Who::Audience, [Forbidden, Forbidden, NotFound,  NotFound ]),
    (Action::ManageCapacity,      Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::WriteReservation,    Who::Owner,    [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::WriteReservation,    Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::WriteReservation,    Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::WriteReservation,    Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ReaffirmReservation, Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ReaffirmReservation, Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ReaffirmReservation, Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ReaffirmReservation, Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    // Nodes are the market's listings: every key reads them.
    (Action::ReadNode,            Who::Owner,    [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadNode,            Who::Manager,  [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadNode,            Who::Audience, [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadNode,            Who::Stranger, [Allow,     Allow,     Allow,     Allow    ]),
    (Action::RegisterNode,        Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::RegisterNode,        Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::RegisterNode,        Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::RegisterNode,        Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::UpdateNode,          Who::Owner,    [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::UpdateNode,          Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::UpdateNode,          Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::UpdateNode,          Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ChangeNodeOwner,     Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ChangeNodeOwner,     Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ChangeNodeOwner,     Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ChangeNodeOwner,     Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
    // Other orgs cannot probe which org ids exist.
    (Action::ManageOwnerKeys,     Who::Owner,    [Allow,     Forbidden, Forbidden, Forbidden]),
    (Action::ManageOwnerKeys,     Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ManageOwnerKeys,     Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ManageOwnerKeys,     Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerAdminKey,  Who::Owner,    [Allow,     Forbidden, Forbidden, Forbidden]),
    (Action::IssueOwnerAdminKey,  Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerAdminKey,  Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerAdminKey,  Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerViewerKey, Who::Owner,    [Allow,     Forbidden, Forbidden, Forbidden]),
    (Action::IssueOwnerViewerKey, Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerViewerKey, Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::IssueOwnerViewerKey, Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerAdminKey, Who::Owner,    [Allow,     Forbidden, Forbidden, Forbidden]),
    (Action::RevokeOwnerAdminKey, Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerAdminKey, Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerAdminKey, Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerViewerKey, Who::Owner,   [Allow,     Forbidden, Forbidden, Forbidden]),
    (Action::RevokeOwnerViewerKey, Who::Manager, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerViewerKey, Who::Audience, [NotFound, NotFound,  NotFound,  NotFound ]),
    (Action::RevokeOwnerViewerKey, Who::Stranger, [NotFound, NotFound,  NotFound,  NotFound ]),
    (Action::ReadOwnerOrg,        Who::Owner,    [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadOwnerOrg,        Who::Manager,  [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ReadOwnerOrg,        Who::Audience, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ReadOwnerOrg,        Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::CreateOrg,           Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::CreateOrg,           Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::CreateOrg,           Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::CreateOrg,           Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ManageOperatorKeys,  Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ManageOperatorKeys,  Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ManageOperatorKeys,  Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::ManageOperatorKeys,  Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
    // Whether the *units* take the VM is placement's business, not access's.
    (Action::PlaceVm,             Who::Owner,    [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::PlaceVm,             Who::Manager,  [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::PlaceVm,             Who::Audience, [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::PlaceVm,             Who::Stranger, [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::ReadVm,              Who::Owner,    [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadVm,              Who::Manager,  [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadVm,              Who::Audience, [Allow,     Allow,     Allow,     Allow    ]),
    (Action::ReadVm,              Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    // Capacity managers terminate spot workloads on their units with reservation.capacity.
    (Action::TerminateSpotVm,     Who::Owner,    [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::TerminateSpotVm,     Who::Manager,  [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::TerminateSpotVm,     Who::Audience, [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::TerminateSpotVm,     Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    // ...but never a community or verified one.
    (Action::TerminateVerifiedVm, Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::TerminateVerifiedVm, Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::TerminateVerifiedVm, Who::Audience, [Allow,     Forbidden, Allow,     Forbidden]),
    (Action::TerminateVerifiedVm, Who::Stranger, [NotFound,  NotFound,  NotFound,  NotFound ]),
    (Action::ReadAudit,           Who::Owner,    [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::ReadAudit,           Who::Manager,  [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::ReadAudit,           Who::Audience, [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::ReadAudit,           Who::Stranger, [Allow,     Allow,     Forbidden, Forbidden]),
    (Action::VerifyAudit,         Who::Owner,    [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::VerifyAudit,         Who::Manager,  [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::VerifyAudit,         Who::Audience, [Forbidden, Forbidden, Forbidden, Forbidden]),
    (Action::VerifyAudit,         Who::Stranger, [Forbidden, Forbidden, Forbidden, Forbidden]),
];

/// A platform operator key (`Caller::operator`, above all orgs).
#[rustfmt::skip]
const OPERATOR_TABLE: &[(Action, Decision)] = &[
    (Action::ReadReservation,     Allow),
    (Action::ManageCapacity,      Allow),
    (Action::WriteReservation,    Allow),
    (Action::ReaffirmReservation, Allow),
    (Action::ReadNode,            Allow),
    (Action::RegisterNode,        Allow),
    (Action::UpdateNode,          Allow),
    (Action::ChangeNodeOwner,     Allow),
    (Action::ManageOwnerKeys,     Allow),
    (Action::IssueOwnerAdminKey,  Allow),
    (Action::IssueOwnerViewerKey, Allow),
    (Action::RevokeOwnerAdminKey, Allow),
    (Action::RevokeOwnerViewerKey, Allow),
    (Action::ReadOwnerOrg,        Allow),
    (Action::CreateOrg,           Allow),
    (Action::ManageOperatorKeys,  Allow),
    // An operator has no org to run a workload for.
    (Action::PlaceVm,             Forbidden),
    (Action::ReadVm,              Allow),
    (Action::TerminateSpotVm,     Allow),
    (Action::TerminateVerifiedVm, Allow),
    (Action::ReadAudit,           Allow),
    (Action::VerifyAudit,         Allow),
];

/// Keys with an explicit permission list, which narrows the role and never widens it.
#[rustfmt::skip]
const NARROWED_TABLE: &[(Action, Who, Role, &[Permission], Decision)] = &[
    // Capacity without reservation.capacity is NotFound even for the owner and managers...
    (Action::ManageCapacity, Who::Owner,    Role::Admin,           &[Permission::ReservationRead], NotFound),
    (Action::ManageCapacity, Who::Manager,  Role::CapacityManager, &[Permission::ReservationRead, Permission::ReservationWrite], NotFound),
    (Action::ManageCapacity, Who::Manager,  Role::CapacityManager, &[], NotFound),
    // ...and reservation.capacity alone is enough for them, and Forbidden for the audience.
    (Action::ManageCapacity, Who::Owner,    Role::CapacityManager, &[Permission::ReservationCapacity], Allow),
    (Action::ManageCapacity, Who::Manager,  Role::Admin,           &[Permission::ReservationCapacity], Allow),
    (Action::ManageCapacity, Who::Audience, Role::Admin,           &[Permission::ReservationCapacity], Forbidden),
    (Action::ManageCapacity, Who::Stranger, Role::Admin,           &[Permission::ReservationCapacity], NotFound),
    // A list cannot widen a role: a member or viewer listing reservation.capacity has none.
    (Action::ManageCapacity, Who::Owner,    Role::Member,          &[Permission::ReservationCapacity], NotFound),
    (Action::ManageCapacity, Who::Manager,  Role::Viewer,          &[Permission::ReservationCapacity, Permission::ReservationRead], NotFound),
    (Action::WriteReservation, Who::Owner,  Role::Member,          &[Permission::ReservationWrite], Forbidden),
    (Action::UpdateNode,     Who::Owner,    Role::Viewer,          &[Permission::NodeWrite], Forbidden),
    (Action::ManageOwnerKeys, Who::Owner,   Role::CapacityManager, &[Permission::ApikeyManage], Forbidden),
    (Action::PlaceVm,        Who::Audience, Role::Viewer,          &[Permission::VmWrite], Forbidden),
    (Action::TerminateSpotVm, Who::Owner,   Role::Member,          &[Permission::ReservationCapacity, Permission::VmRead], Forbidden),
    (Action::ReadAudit,      Who::Owner,    Role::Member,          &[Permission::AuditRead], Forbidden),
    // Narrowing takes away what the role had.
    (Action::ReadReservation, Who::Audience, Role::Admin,          &[Permission::VmRead], Forbidden),
    (Action::ReadReservation, Who::Stranger, Role::Admin,          &[Permission::VmRead], NotFound),
    (Action::WriteReservation, Who::Owner,  Role::Admin,           &[Permission::ReservationCapacity], Forbidden),
    (Action::WriteReservation, Who::Owner,  Role::Admin,           &[Permission::ReservationWrite], Allow),
    (Action::ReadNode,       Who::Stranger, Role::Viewer,          &[Permission::VmRead], Forbidden),
    (Action::UpdateNode,     Who::Owner,    Role::Admin,           &[Permission::NodeRead], Forbidden),
    (Action::ManageOwnerKeys, Who::Owner,   Role::Admin,           &[Permission::ApikeyManage], Allow),
    (Action::ManageOwnerKeys, Who::Owner,   Role::Admin,           &[Permission::NodeRead], Forbidden),
    // A key never mints a key holding more than it holds itself.
    (Action::IssueOwnerViewerKey, Who::Owner, Role::Admin,         &[Permission::ApikeyManage], Forbidden),
    (Action::IssueOwnerViewerKey, Who::Owner, Role::Admin,         &[Permission::ApikeyManage, Permission::NodeRead, Permission::ReservationRead, Permission::VmRead], Allow),
    (Action::IssueOwnerAdminKey,  Who::Owner, Role::Admin,         &[Permission::ApikeyManage, Permission::NodeRead, Permission::ReservationRead, Permission::VmRead], Forbidden),
    (Action::IssueOwnerViewerKey, Who::Stranger, Role::Admin,      &[Permission::ApikeyManage], NotFound),
    (Action::RevokeOwnerAdminKey, Who::Owner, Role::Admin,         &[Permission::ApikeyManage], Forbidden),
    (Action::RevokeOwnerViewerKey, Who::Owner, Role::Admin,        &[Permission::ApikeyManage], Forbidden),
    (Action::RevokeOwnerViewerKey, Who::Owner, Role::Admin,        &[Permission::ApikeyManage, Permission::NodeRead, Permission::ReservationRead, Permission::VmRead], Allow),
    (Action::RevokeOwnerAdminKey, Who::Owner, Role::Admin,         &[Permission::ApikeyManage, Permission::NodeRead, Permission::ReservationRead, Permission::VmRead], Forbidden),
    (Action::PlaceVm,        Who::Audience, Role::Member,          &[Permission::VmRead], Forbidden),
    (Action::ReadVm,         Who::Audience, Role::Member,          &[Permission::VmWrite], Forbidden),
    (Action::ReadVm,         Who::Manager,  Role::Admin,           &[Permission::ReservationCapacity], Forbidden),
    (Action::ReadVm,         Who::Stranger, Role::Admin,           &[], NotFound),
    (Action::TerminateSpotVm, Who::Audience, Role::Member,         &[Permission::VmRead], Forbidden),
    (Action::TerminateSpotVm, Who::Manager, Role::CapacityManager, &[Permission::VmRead], Forbidden),
    // A manager that cannot even read VMs is not told that the VM exists.
    (Action::TerminateSpotVm, Who::Manager, Role::CapacityManager, &[Permission::NodeRead], NotFound),
    (Action::TerminateSpotVm, Who::Manager, Role::CapacityManager, &[Permission::ReservationCapacity], Allow),
    (Action::ReadAudit,      Who::Owner,    Role::CapacityManager, &[Permission::NodeRead], Forbidden),
    // Ownership-only decisions ignore the list.
    (Action::ReadOwnerOrg,   Who::Owner,    Role::Viewer,          &[], Allow),
    (Action::ReaffirmReservation, Who::Owner, Role::Admin,         &[], Forbidden),
];

fn check(failures: &mut Vec<String>, what: String, got: Decision, want: Decision) {
    if got != want {
        failures.push(format!("{what}: got {got:?}, want {want:?}"));
    }
}

#[test]
fn org_keys_with_role_bundles() {
    let mut failures = Vec::new();
    for &(action, who, decisions) in ORG_TABLE {
        for (role, want) in ROLES.into_iter().zip(decisions) {
            let caller = org_caller(who.org(), role, None);
            let what = format!("{action:?} by {who:?} with role {}", role.as_str());
            check(&mut failures, what, action.decide(&caller), want);
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn org_table_covers_every_action_and_party_once() {
    let rows: Vec<(Action, Who)> = ORG_TABLE.iter().map(|&(a, w, _)| (a, w)).collect();
    let distinct: BTreeSet<(Action, Who)> = rows.iter().copied().collect();
    assert_eq!(rows.len(), distinct.len(), "a row is repeated");
    for action in Action::ALL {
        for who in Who::ALL {
            assert!(
                distinct.contains(&(action, who)),
                "no row for {action:?} by {who:?}"
            );
        }
    }
}

#[test]
fn operator_keys() {
    let caller = Caller::operator("op-key");
    assert!(caller.is_operator());
    let mut failures = Vec::new();
    for &(action, want) in OPERATOR_TABLE {
        check(
            &mut failures,
            format!("{action:?} by the operator"),
            action.decide(&caller),
            want,
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    let covered: BTreeSet<Action> = OPERATOR_TABLE.iter().map(|&(a, _)| a).collect();
    assert_eq!(covered.len(), OPERATOR_TABLE.len(), "a row is repeated");
    assert_eq!(covered, Action::ALL.into_iter().collect());
}

#[test]
fn keys_with_narrowed_permission_lists() {
    let mut failures = Vec::new();
    for &(action, who, role, explicit, want) in NARROWED_TABLE {
        let caller = org_caller(who.org(), role, Some(explicit));
        let what = format!(
            "{action:?} by {who:?} with role {} narrowed to {explicit:?}",
            role.as_str()
        );
        check(&mut failures, what, action.decide(&caller), want);
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Whatever the role and the list, a key lacking `reservation.capacity` cannot tell a
/// reservation it manages from one that does not exist.
#[test]
fn capacity_without_the_permission_is_always_not_found() {
    for who in Who::ALL {
        for role in Role::ALL {
            let narrowed: Vec<Permission> = role
                .permissions()
                .into_iter()
                .filter(|p| *p != Permission::ReservationCapacity)
                .collect();
            let caller = org_caller(who.org(), role, Some(&narrowed));
            assert_eq!(
                Action::ManageCapacity.decide(&caller),
                NotFound,
                "{who:?} {role:?}"
            );
        }
    }
    let mut operator = Caller::operator("op");
    operator
        .permissions
        .remove(&Permission::ReservationCapacity);
    assert_eq!(Action::ManageCapacity.decide(&operator), NotFound);
}

/// Listing needs `reservation.read` (a listing without it would wrongly say "none"); which
/// reservations it shows is the per-reservation read decision.
#[test]
fn listing_reservations_needs_reservation_read() {
    assert_eq!(may_list_reservations(&Caller::operator("op")), Allow);
    for who in Who::ALL {
        for role in Role::ALL {
            let caller = org_caller(who.org(), role, None);
            assert_eq!(may_list_reservations(&caller), Allow, "{who:?} {role:?}");
            let narrowed: Vec<Permission> = role
                .permissions()
                .into_iter()
                .filter(|p| *p != Permission::ReservationRead)
                .collect();
            let caller = org_caller(who.org(), role, Some(&narrowed));
            assert_eq!(
                may_list_reservations(&caller),
                Forbidden,
                "{who:?} {role:?}"
            );
        }
    }
}

/// An org both in the audience and in `managingOrgIds` manages because it is a manager; an
/// audience without managers confers nothing.
#[test]
fn managing_comes_from_managing_org_ids_only() {
    let both = ["a".to_owned(), "b".to_owned()];
    let none: [String; 0] = [];
    let in_both = ReservationParties {
        node_owner: OWNER,
        allowed_org_ids: &both,
        managing_org_ids: &both,
    };
    let audience_only = ReservationParties {
        node_owner: OWNER,
        allowed_org_ids: &both,
        managing_org_ids: &none,
    };
    let admin_b = org_caller("b", Role::Admin, None);
    assert_eq!(may_manage_capacity(&admin_b, in_both), Allow);
    assert_eq!(may_manage_capacity(&admin_b, audience_only), Forbidden);
    assert_eq!(may_read_reservation(&admin_b, audience_only), Allow);
    // The owner needs no list at all.
    let owner = org_caller(OWNER, Role::CapacityManager, None);
    assert_eq!(may_manage_capacity(&owner, audience_only), Allow);
}

/// A capacity manager may terminate a spot VM on its units even when the VM is its own org's
/// and the key lacks `vm.write`: the same key's reclaim would terminate it anyway.
#[test]
fn capacity_manager_terminates_its_own_orgs_spot_vm() {
    let managers = [OWNER.to_owned()];
    let own_spot = VmParties {
        vm_org: OWNER,
        is_spot: true,
        capacity_managers: &managers,
    };
    let own_verified = VmParties {
        is_spot: false,
        ..own_spot.clone()
    };
    let cap = org_caller(OWNER, Role::CapacityManager, None);
    assert_eq!(may_terminate_vm(&cap, &own_spot), Allow);
    assert_eq!(may_terminate_vm(&cap, &own_verified), Forbidden);
    let viewer = org_caller(OWNER, Role::Viewer, None);
    assert_eq!(may_terminate_vm(&viewer, &own_spot), Forbidden);
    let member = org_caller(OWNER, Role::Member, None);
    assert_eq!(may_terminate_vm(&member, &own_verified), Allow);
}

#[test]
fn role_bundles() {
    use Permission::*;
    let expected: [(Role, &[Permission]); 4] = [
        (Role::Admin, &Permission::ALL),
        (
            Role::CapacityManager,
            &[
                NodeRead,
                NodeWrite,
                ReservationRead,
                ReservationWrite,
                ReservationCapacity,
                VmRead,
                AuditRead,
            ],
        ),
        (Role::Member, &[NodeRead, ReservationRead, VmRead, VmWrite]),
        (Role::Viewer, &[NodeRead, ReservationRead, VmRead]),
    ];
    for (role, permissions) in expected {
        assert_eq!(
            role.permissions(),
            permissions.iter().copied().collect::<BTreeSet<_>>(),
            "{role:?}"
        );
    }
}

#[test]
fn explicit_lists_only_narrow() {
    use Permission::*;
    for role in Role::ALL {
        assert_eq!(effective_permissions(role, None), role.permissions());
        assert!(effective_permissions(role, Some(&[])).is_empty());
        assert_eq!(
            effective_permissions(role, Some(&Permission::ALL)),
            role.permissions(),
            "the full list gives back exactly the role's"
        );
        for p in Permission::ALL {
            let got = effective_permissions(role, Some(&[p, p]));
            let want: BTreeSet<_> = role.permissions().into_iter().filter(|q| *q == p).collect();
            assert_eq!(got, want, "{role:?} narrowed to {p}");
        }
    }
    assert_eq!(
        effective_permissions(
            Role::Member,
            Some(&[VmWrite, ReservationCapacity, AuditRead])
        ),
        BTreeSet::from([VmWrite])
    );
}

#[test]
fn names_round_trip() {
    for p in Permission::ALL {
        assert_eq!(p.as_str().parse::<Permission>(), Ok(p));
        assert_eq!(p.to_string(), p.as_str());
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, format!("\"{}\"", p.as_str()));
        assert_eq!(serde_json::from_str::<Permission>(&json).unwrap(), p);
    }
    let names: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "node.read",
            "node.write",
            "reservation.read",
            "reservation.write",
            "reservation.capacity",
            "vm.read",
            "vm.write",
            "audit.read",
            "apikey.manage",
        ]
    );
    for r in Role::ALL {
        assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, format!("\"{}\"", r.as_str()));
    }
    let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(roles, ["admin", "capacity-manager", "member", "viewer"]);
    assert!("Admin".parse::<Role>().is_err());
    assert!("reservation.*".parse::<Permission>().is_err());
}

#[test]
fn whoami_lists_only_usable_permissions() {
    // The operator holds every permission but cannot place VMs (it has no org), so it is not
    // told it has vm.write; everything else it lists, it can use.
    let operator = Caller::operator("op");
    let usable = usable_permissions(&operator);
    assert!(!usable.contains(&Permission::VmWrite));
    assert_eq!(may_place_vm(&operator), Forbidden);
    assert_eq!(usable.len(), Permission::ALL.len() - 1);
    // An org key's usable permissions are its effective ones.
    for role in Role::ALL {
        let caller = org_caller(OWNER, role, None);
        assert_eq!(usable_permissions(&caller), role.permissions(), "{role:?}");
        assert_eq!(
            usable_permissions(&caller).contains(&Permission::VmWrite),
            may_place_vm(&caller) == Allow,
            "{role:?}"
        );
    }
}

#[test]
fn a_permission_list_may_only_narrow_its_role_and_names_each_permission_once() {
    use reservations_domain::access::permission_list;
    let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let narrowed = permission_list(Role::CapacityManager, &names(&["reservation.read"])).unwrap();
    assert_eq!(
        effective_permissions(Role::CapacityManager, Some(&narrowed)),
        narrowed.iter().copied().collect()
    );
    for (role, list) in [
        (Role::Viewer, names(&["capacity.write"])),
        (
            Role::Admin,
            names(&["reservation.read", "reservation.read"]),
        ),
        (Role::Admin, names(&["no.such-permission"])),
    ] {
        let refused = permission_list(role, &list).unwrap_err();
        assert_eq!(
            (refused.code(), refused.refusal()),
            ("invalid-field", reservations_domain::Refusal::InvalidInput),
            "{role:?} {list:?}"
        );
    }
    assert!(
        permission_list(Role::Viewer, &[]).unwrap().is_empty(),
        "an empty list leaves the key nothing"
    );
}
