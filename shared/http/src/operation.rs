//! The writes an endpoint can ask for, each a value its handler builds from the request:
//! what the request names, checked into domain values, and nothing else. The executor
//! ([`crate::execute`]) runs it; this module supplies the pure pieces it runs: the cell the
//! write is at home in ([`Operation::home`]), and one attempt's plan with its answer rendered
//! ([`Operation::plan`]).
//!
//! Release, reclaim and dry run are one operation, [`Operation::ChangeCapacity`], which the
//! store plans by one code path, so a dry run can never disagree with the reclaim it
//! predicts; their components share the reclaim's body (the dry run's too) and
//! [`asked`].

use reservations_domain::Timestamp;
use reservations_domain::access::{Permission, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::ids::{ApiKey, Id, Node, OperatorKey, Org, Vm};
use reservations_domain::reservation::NewReservation;
use reservations_domain::values::{Name, Reason};
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::cells::{CellStores, Cells};
use reservations_store::keys::NewApiKey;
use reservations_store::vms::NewVm;
use reservations_store::write::Planned;
use reservations_store::{Context, Result, Store};
use serde::Deserialize;
use spin_sdk::http::Request;

use crate::auth::{IssuedKey, random_hex};
use crate::input::ReservationPath;
use crate::input::{Call, not_null};
use crate::problem::Problem;
use crate::render;
use crate::render::Reply;

/// A write an endpoint asks for.
pub enum Operation {
    /// A release, reclaim or dry run of units of a reservation.
    ChangeCapacity(CapacityAsked),
    PlaceVm {
        node_id: Id<Node>,
        unit_ids: Vec<String>,
        tier: Tier,
    },
    TerminateVm(Id<Vm>),
    CreateReservation {
        node_id: Id<Node>,
        id: String,
        request: NewReservation,
    },
    CancelReservation {
        at: ReservationPath,
        reason: Option<Reason>,
    },
    ReaffirmReservation {
        at: ReservationPath,
        unit_ids: Option<Vec<String>>,
        reason: Option<Reason>,
    },
    PutNode {
        node_id: Id<Node>,
        owner_org_id: String,
        unit_ids: Vec<String>,
    },
    CreateOrg {
        id: Id<Org>,
        name: Name,
    },
    CreateKey {
        org_id: Id<Org>,
        name: Name,
        role: Role,
        permissions: Option<Vec<Permission>>,
        issued: IssuedKey,
    },
    RevokeKey {
        org_id: Id<Org>,
        key_id: Id<ApiKey>,
    },
    CreateOperatorKey {
        name: Name,
        issued: IssuedKey,
    },
    RevokeOperatorKey(Id<OperatorKey>),
}

/// A release, reclaim or dry run as the caller asked for it.
pub struct CapacityAsked {
    pub action: CapacityAction,
    pub at: ReservationPath,
    pub unit_ids: Vec<String>,
    pub reason: Option<Reason>,
    pub representation: Representation,
    /// Reclaim and dry run: seconds of notice for the spot VMs.
    pub notice_seconds: Option<i64>,
    /// Release: when the units come back by themselves.
    pub until: Option<Timestamp>,
}

/// What names the cell a write is at home in (docs/design.md, "Cells").
pub(crate) enum Home<'a> {
    /// The directory: orgs and keys.
    Directory,
    /// The cell of this node.
    Node(&'a str),
    /// The cell this VM's id names (or, should the VM not be there, whichever has it).
    Vm(&'a str),
}

impl Operation {
    /// Whether it writes: everything but a dry run.
    pub(crate) fn writes(&self) -> bool {
        match self {
            Operation::ChangeCapacity(asked) => asked.action.writes(),
            _ => true,
        }
    }

    pub(crate) fn home(&self) -> Home<'_> {
        match self {
            Operation::ChangeCapacity(asked) => Home::Node(&asked.at.node_id),
            Operation::PlaceVm { node_id, .. }
            | Operation::CreateReservation { node_id, .. }
            | Operation::PutNode { node_id, .. } => Home::Node(node_id),
            Operation::CancelReservation { at, .. } | Operation::ReaffirmReservation { at, .. } => {
                Home::Node(&at.node_id)
            }
            Operation::TerminateVm(id) => Home::Vm(id),
            Operation::CreateOrg { .. }
            | Operation::CreateKey { .. }
            | Operation::RevokeKey { .. }
            | Operation::CreateOperatorKey { .. }
            | Operation::RevokeOperatorKey(_) => Home::Directory,
        }
    }

    /// What has to happen once, before the first plan: a revocation is told to every cell
    /// but the directory, so that no cell's write takes the key once it is answered.
    pub(crate) fn prepare(&self, stores: &CellStores<'_>, ctx: &Context<'_>) -> Result<()> {
        match self {
            Operation::RevokeKey { org_id, key_id } => {
                stores.tell_every_cell(ctx, Some(org_id), key_id)
            }
            Operation::RevokeOperatorKey(key_id) => stores.tell_every_cell(ctx, None, key_id),
            _ => Ok(()),
        }
    }

    /// One attempt: the plan `store` (of a cell of `cells`) makes from fresh facts, with the
    /// answer it gives.
    pub(crate) fn plan(
        &self,
        cells: Cells,
        store: &Store<'_>,
        ctx: &Context<'_>,
    ) -> Result<Planned<Reply>> {
        let now = ctx.now;
        let caller = ctx.caller;
        Ok(match self {
            Operation::ChangeCapacity(asked) => answered(
                store.capacity().plan_capacity(ctx, &asked.change())?,
                |outcome| {
                    let mut reply = match asked.action {
                        CapacityAction::Release => Reply::ok(render::release(outcome, now)),
                        CapacityAction::Reclaim => Reply::ok(render::reclaim(outcome, now)),
                        CapacityAction::ReclaimDryRun => {
                            Reply::ok(render::reclaim_dry_run(outcome, now))
                        }
                    };
                    if asked.representation == Representation::Minimal {
                        reply
                            .headers
                            .push(("preference-applied", "return=minimal".to_owned()));
                    }
                    reply
                },
            ),
            Operation::PlaceVm {
                node_id,
                unit_ids,
                tier,
            } => {
                // The VM sits with its node, in its cell: an id that names that cell finds it
                // there.
                let id = &std::iter::repeat_with(|| format!("vm-{}", random_hex(8)))
                    .find(|id| cells.home_of(id) == cells.home_of(node_id))
                    .expect("an endless supply of ids");
                let vm = NewVm {
                    id,
                    node_id,
                    unit_ids,
                    tier: *tier,
                };
                answered(store.capacity().plan_place_vm(ctx, &vm)?, |vm| {
                    Reply::created(render::vm(vm, caller), format!("/v1/vms/{id}"))
                })
            }
            Operation::TerminateVm(id) => {
                answered(store.capacity().plan_terminate_vm(ctx, id)?, |vm| {
                    Reply::ok(render::vm(vm, caller))
                })
            }
            Operation::CreateReservation {
                node_id,
                id,
                request,
            } => answered(
                store
                    .capacity()
                    .plan_create_reservation(ctx, node_id, id, request)?,
                |reservation| {
                    Reply::created(
                        render::reservation(reservation, now),
                        format!("/v1/nodes/{node_id}/reservations/{id}"),
                    )
                },
            ),
            Operation::CancelReservation { at, reason } => answered(
                store.capacity().plan_cancel_reservation(
                    ctx,
                    &at.node_id,
                    &at.id,
                    reason.as_ref().map(Reason::as_str),
                )?,
                |reservation| Reply::ok(render::reservation(reservation, now)),
            ),
            Operation::ReaffirmReservation {
                at,
                unit_ids,
                reason,
            } => answered(
                store.capacity().plan_reaffirm_reservation(
                    ctx,
                    &at.node_id,
                    &at.id,
                    unit_ids.as_deref(),
                    reason.as_ref().map(Reason::as_str),
                )?,
                |reservation| Reply::ok(render::reservation(reservation, now)),
            ),
            Operation::PutNode {
                node_id,
                owner_org_id,
                unit_ids,
            } => answered(
                store
                    .capacity()
                    .plan_put_node(ctx, node_id, owner_org_id, unit_ids)?,
                |written| {
                    let rendered = render::node_with_sales(&written.node, written.units_for_sale)
                        .with_withheld_reservations(&written.withheld_reservation_ids);
                    match written.created {
                        true => Reply::created(rendered, format!("/v1/nodes/{node_id}")),
                        false => Reply::ok(rendered),
                    }
                },
            ),
            Operation::CreateOrg { id, name } => answered(
                store.identity().plan_create_org(ctx, id, name.as_str())?,
                |org| Reply::created(render::org(org), format!("/v1/orgs/{id}")),
            ),
            Operation::CreateKey {
                org_id,
                name,
                role,
                permissions,
                issued,
            } => {
                let key = NewApiKey {
                    id: &issued.id,
                    org_id,
                    name: name.as_str(),
                    role: *role,
                    permissions: permissions.as_deref(),
                    secret_hash: &issued.secret_hash,
                };
                answered(store.identity().plan_create_key(ctx, &key)?, |key| {
                    Reply::created(
                        render::issued(render::api_key(key), issued.token.clone()),
                        format!("/v1/orgs/{org_id}/keys/{}", key.id),
                    )
                    .with_secret_shown_once("token")
                })
            }
            Operation::RevokeKey { org_id, key_id } => answered(
                store.identity().plan_revoke_key(ctx, org_id, key_id)?,
                |key| Reply::ok(render::api_key(key)),
            ),
            Operation::CreateOperatorKey { name, issued } => answered(
                store.identity().plan_create_operator_key(
                    ctx,
                    &issued.id,
                    name.as_str(),
                    &issued.secret_hash,
                )?,
                |key| {
                    Reply::created(
                        render::issued(render::operator_key(key), issued.token.clone()),
                        format!("/v1/operator/keys/{}", key.id),
                    )
                    .with_secret_shown_once("token")
                },
            ),
            Operation::RevokeOperatorKey(key_id) => answered(
                store.identity().plan_revoke_operator_key(ctx, key_id)?,
                |key| Reply::ok(render::operator_key(key)),
            ),
        })
    }
}

/// A plan with its outcome rendered as the answer it gives, the write unchanged.
fn answered<T>(planned: Planned<T>, answer: impl FnOnce(&T) -> Reply) -> Planned<Reply> {
    Planned {
        outcome: answer(&planned.outcome),
        write: planned.write,
    }
}

impl CapacityAsked {
    fn change(&self) -> CapacityChange<'_> {
        CapacityChange {
            action: self.action,
            node_id: &self.at.node_id,
            reservation_id: &self.at.id,
            unit_ids: &self.unit_ids,
            reason: self.reason.as_ref().map(Reason::as_str),
            representation: self.representation,
            notice_seconds: self.notice_seconds,
            until: self.until,
        }
    }
}

/// A reclaim or its dry run: the v1 contract's request body plus an optional notice for the spot
/// VMs, `noticeSeconds` (0–3600; absent or 0 stops them now, as the v1 contract says).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReclaimBody {
    pub unit_ids: Vec<String>,
    #[serde(default, deserialize_with = "not_null")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    pub notice_seconds: Option<i64>,
}

/// A reclaim or its dry run (`action`) of `body` on the reservation at `path`.
pub fn take_back(
    call: &Call<'_>,
    action: CapacityAction,
    path: ReservationPath,
    body: ReclaimBody,
) -> Result<Operation, Problem> {
    Ok(Operation::ChangeCapacity(CapacityAsked {
        notice_seconds: body.notice_seconds,
        ..asked(call, action, path, body.unit_ids, body.reason)?
    }))
}

/// A capacity request without notice or end: `action` on units of the reservation, why, and
/// how much of the reservation to answer with.
pub fn asked(
    call: &Call<'_>,
    action: CapacityAction,
    at: ReservationPath,
    unit_ids: Vec<String>,
    reason: Option<String>,
) -> Result<CapacityAsked, Problem> {
    Ok(CapacityAsked {
        action,
        at,
        unit_ids,
        reason: Reason::optional(reason)?,
        representation: preferred_representation(call.request),
        notice_seconds: None,
        until: None,
    })
}

/// `Prefer: return=minimal` (RFC 7240) leaves the reservation's unit lists out of the
/// response, so a release or reclaim on a huge reservation costs only the units it names.
fn preferred_representation(request: &Request) -> Representation {
    let minimal = request
        .header("prefer")
        .and_then(|v| v.as_str())
        .is_some_and(|prefer| {
            prefer
                .split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("return=minimal"))
        });
    if minimal {
        Representation::Minimal
    } else {
        Representation::Full
    }
}
