//! The API's JSON representations, camelCase exactly as the v1 contract names them: one `Serialize` type per
//! response shape, built from the store's objects. A [`crate::Reply`] holds its body as a
//! JSON value, whose members go out in name order whatever order a type declares them in.
//! Below them: the response that carries a [`Reply`] or a [`Problem`].

use crate::problem::{PROBLEM_CONTENT_TYPE, Problem};
use crate::routes::REQUEST_ID_HEADER;
use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, Permission, usable_permissions};
use reservations_domain::audit::{EventView, event_view};
use reservations_domain::market::Offer;
use reservations_domain::notice::Interruption;
use reservations_domain::reservation::Reservation;
use reservations_domain::time::to_rfc3339;
use reservations_domain::vm::Vm;
use reservations_store::Page;
use reservations_store::audit::{AuditEvent, Listed};
use reservations_store::capacity::{CapacityOutcome, Representation};
use reservations_store::keys::{ApiKey, OperatorKey};
use reservations_store::nodes::{ListedNode, Node, NodeSummary};
use reservations_store::orgs::Org;
use serde::Serialize;
use serde_json::Value;
use spin_sdk::http::{Response, ResponseBuilder};
use std::collections::BTreeMap;

/// A reservation as the v1 contract's response schema describes it, its status derived at a time;
/// the minimal representation leaves out `reservedUnitIds` and `releasedUnitIds`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationBody<'a> {
    id: &'a str,
    node_id: &'a str,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved_unit_ids: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    released_unit_ids: Option<&'a [String]>,
    allowed_org_ids: &'a [String],
    managing_org_ids: &'a [String],
    starts_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ends_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    contract_ref: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    topology_gen: i64,
    created_at: String,
    updated_at: String,
    /// When each released unit whose release is timed comes back.
    #[serde(skip_serializing_if = "Option::is_none")]
    released_until: Option<BTreeMap<&'a str, String>>,
}

/// Instants by id, as RFC 3339.
fn times_by_id(times: &BTreeMap<String, Timestamp>) -> BTreeMap<&str, String> {
    times
        .iter()
        .map(|(id, at)| (id.as_str(), to_rfc3339(*at)))
        .collect()
}

pub fn reservation(r: &Reservation, now: Timestamp) -> ReservationBody<'_> {
    reservation_with(r, now, Representation::Full)
}

pub fn reservation_with(
    r: &Reservation,
    now: Timestamp,
    representation: Representation,
) -> ReservationBody<'_> {
    let full = representation == Representation::Full;
    ReservationBody {
        id: &r.id,
        node_id: &r.node_id,
        status: r.status(now).as_str(),
        reserved_unit_ids: full.then_some(&r.reserved_unit_ids[..]),
        released_unit_ids: full.then_some(&r.released_unit_ids[..]),
        allowed_org_ids: &r.allowed_org_ids,
        managing_org_ids: &r.managing_org_ids,
        starts_at: to_rfc3339(r.term.starts_at),
        ends_at: r.term.ends_at.map(to_rfc3339),
        contract_ref: r.contract_ref.as_deref(),
        reason: r.reason.as_deref(),
        topology_gen: r.topology_gen,
        created_at: to_rfc3339(r.created_at),
        updated_at: to_rfc3339(r.updated_at),
        released_until: (full && !r.released_until.is_empty())
            .then(|| times_by_id(&r.released_until)),
    }
}

/// The reservation plus what a reclaim did: with a notice, the VMs listed in `terminated`
/// run until their `terminatesAt`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimBody<'a> {
    #[serde(flatten)]
    reservation: ReservationBody<'a>,
    terminated: &'a [String],
    skipped: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    terminates_at: Option<BTreeMap<&'a str, String>>,
}

/// The reservation plus what a reclaim would do.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DryRunBody<'a> {
    #[serde(flatten)]
    reservation: ReservationBody<'a>,
    would_terminate: &'a [String],
    would_skip: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    terminates_at: Option<BTreeMap<&'a str, String>>,
}

/// The reservation after a release; with `until`, the deadlines it gave the spot VMs
/// already on the units.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseBody<'a> {
    #[serde(flatten)]
    reservation: ReservationBody<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    terminates_at: Option<BTreeMap<&'a str, String>>,
}

fn deadlines(outcome: &CapacityOutcome) -> Option<BTreeMap<&str, String>> {
    (!outcome.plan.deadlines.is_empty()).then(|| times_by_id(&outcome.plan.deadlines))
}

pub fn release(outcome: &CapacityOutcome, now: Timestamp) -> ReleaseBody<'_> {
    ReleaseBody {
        reservation: outcome_reservation(outcome, now),
        terminates_at: deadlines(outcome),
    }
}

fn outcome_reservation(outcome: &CapacityOutcome, now: Timestamp) -> ReservationBody<'_> {
    reservation_with(&outcome.reservation, now, outcome.representation)
}

pub fn reclaim(outcome: &CapacityOutcome, now: Timestamp) -> ReclaimBody<'_> {
    ReclaimBody {
        reservation: outcome_reservation(outcome, now),
        terminated: &outcome.plan.terminate,
        skipped: &outcome.plan.skip,
        terminates_at: deadlines(outcome),
    }
}

pub fn reclaim_dry_run(outcome: &CapacityOutcome, now: Timestamp) -> DryRunBody<'_> {
    DryRunBody {
        reservation: outcome_reservation(outcome, now),
        would_terminate: &outcome.plan.terminate,
        would_skip: &outcome.plan.skip,
        terminates_at: deadlines(outcome),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummaryBody<'a> {
    id: &'a str,
    owner_org_id: &'a str,
    topology_gen: i64,
    unit_count: i64,
    created_at: String,
    updated_at: String,
}

pub fn node_summary(n: &NodeSummary) -> NodeSummaryBody<'_> {
    NodeSummaryBody {
        id: &n.id,
        owner_org_id: &n.owner_org_id,
        topology_gen: n.topology_gen,
        unit_count: n.unit_count,
        created_at: to_rfc3339(n.created_at),
        updated_at: to_rfc3339(n.updated_at),
    }
}

/// A node of the listing: its summary and how many of its units are on the spot market.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedNodeBody<'a> {
    #[serde(flatten)]
    summary: NodeSummaryBody<'a>,
    released_idle_unit_count: i64,
}

pub fn listed_node(n: &ListedNode) -> ListedNodeBody<'_> {
    ListedNodeBody {
        summary: node_summary(&n.summary),
        released_idle_unit_count: n.released_idle_unit_count,
    }
}

/// A node with its units and how many of them are on the spot market right now (released
/// and idle); after a write, with the reservations the write withheld for review.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeBody<'a> {
    #[serde(flatten)]
    summary: NodeSummaryBody<'a>,
    unit_ids: &'a [String],
    released_idle_unit_count: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    withheld_reservation_ids: Option<&'a [String]>,
}

pub fn node_with_sales(n: &Node, released_idle_units: i64) -> NodeBody<'_> {
    NodeBody {
        summary: node_summary(&n.summary),
        unit_ids: &n.unit_ids,
        released_idle_unit_count: released_idle_units,
        withheld_reservation_ids: None,
    }
}

impl<'a> NodeBody<'a> {
    pub fn with_withheld_reservations(mut self, ids: &'a [String]) -> NodeBody<'a> {
        self.withheld_reservation_ids = Some(ids);
        self
    }
}

/// A unit for sale: the node, the unit, the tier it sells at, and until when (the term's end,
/// absent when open-ended). Nothing else about the reservation.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferBody<'a> {
    node_id: &'a str,
    unit_id: &'a str,
    tier: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ends_at: Option<String>,
}

pub fn offer(o: &Offer) -> OfferBody<'_> {
    OfferBody {
        node_id: &o.node_id,
        unit_id: &o.unit_id,
        tier: "spot",
        ends_at: o.until.map(to_rfc3339),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmBody<'a> {
    id: &'a str,
    org_id: &'a str,
    node_id: &'a str,
    unit_ids: &'a [String],
    tier: &'static str,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    termination_reason: Option<&'static str>,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    terminated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interruption: Option<InterruptionBody<'a>>,
}

/// A VM's notice: why, since when, until when, which units it gives back and, to those who
/// read the VM as managers of that capacity (and operators), which reservation took them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionBody<'a> {
    reason: &'static str,
    noticed_at: String,
    terminates_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation_id: Option<&'a str>,
    unit_ids: &'a [String],
}

/// The VM as `caller` reads it. Its own org (the buyer) is not told which reservation took
/// its units back: that reservation, like its audit events, is its parties' business.
pub fn vm<'a>(v: &'a Vm, caller: &Caller) -> VmBody<'a> {
    let sees_reservation = caller.is_operator() || !caller.is_org(&v.org_id);
    let interruption = |i: &'a Interruption| InterruptionBody {
        reason: i.reason.as_str(),
        noticed_at: to_rfc3339(i.noticed_at),
        terminates_at: to_rfc3339(i.terminates_at),
        reservation_id: sees_reservation.then_some(i.reservation_id.as_str()),
        unit_ids: &i.unit_ids,
    };
    VmBody {
        id: &v.id,
        org_id: &v.org_id,
        node_id: &v.node_id,
        unit_ids: &v.unit_ids,
        tier: v.tier.as_str(),
        status: v.status.as_str(),
        termination_reason: v.termination_reason.map(|r| r.as_str()),
        created_at: to_rfc3339(v.created_at),
        terminated_at: v.terminated_at.map(to_rfc3339),
        interruption: v.interruption.as_ref().map(interruption),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrgBody<'a> {
    id: &'a str,
    name: &'a str,
    created_at: String,
}

pub fn org(o: &Org) -> OrgBody<'_> {
    OrgBody {
        id: &o.id,
        name: &o.name,
        created_at: to_rfc3339(o.created_at),
    }
}

/// `active` or `revoked`.
fn key_status(revoked_at: Option<Timestamp>) -> &'static str {
    if revoked_at.is_some() {
        "revoked"
    } else {
        "active"
    }
}

/// A key as listings show it: never the secret, nor its hash.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyBody<'a> {
    id: &'a str,
    org_id: &'a str,
    name: &'a str,
    role: &'static str,
    permissions: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    explicit_permissions: Option<Vec<&'static str>>,
    status: &'static str,
    created_at: String,
    created_by: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at: Option<String>,
}

pub fn api_key(k: &ApiKey) -> ApiKeyBody<'_> {
    ApiKeyBody {
        id: &k.id,
        org_id: &k.org_id,
        name: &k.name,
        role: k.role.as_str(),
        permissions: k
            .effective_permissions()
            .iter()
            .map(|p| p.as_str())
            .collect(),
        explicit_permissions: k
            .permissions
            .as_ref()
            .map(|list| list.iter().map(|p| p.as_str()).collect()),
        status: key_status(k.revoked_at),
        created_at: to_rfc3339(k.created_at),
        created_by: &k.created_by,
        revoked_at: k.revoked_at.map(to_rfc3339),
    }
}

/// An operator key as listings show it: never the secret, nor its hash.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorKeyBody<'a> {
    id: &'a str,
    name: &'a str,
    operator: bool,
    status: &'static str,
    created_at: String,
    created_by: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at: Option<String>,
}

pub fn operator_key(k: &OperatorKey) -> OperatorKeyBody<'_> {
    OperatorKeyBody {
        id: &k.id,
        name: &k.name,
        operator: true,
        status: key_status(k.revoked_at),
        created_at: to_rfc3339(k.created_at),
        created_by: &k.created_by,
        revoked_at: k.revoked_at.map(to_rfc3339),
    }
}

/// A key just issued: what listings show, and its token, which only this response carries
/// (see [`crate::Reply::with_secret_shown_once`]).
#[derive(Serialize)]
pub struct IssuedKeyBody<K> {
    #[serde(flatten)]
    key: K,
    token: String,
}

pub fn issued<K: Serialize>(key: K, token: String) -> IssuedKeyBody<K> {
    IssuedKeyBody { key, token }
}

/// `{ "items": [...], "nextCursor": "..." }`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PageBody<R> {
    items: Vec<R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    /// To operators: the rows of the page that cannot be read, by key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unreadable: Vec<UnreadableKeyBody>,
}

/// A stored row of a listing that cannot be read, as operators are told of it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableKeyBody {
    key: String,
    detail: String,
}

pub fn page<'p, T, R>(
    page: &'p Page<T>,
    caller: &Caller,
    item: impl Fn(&'p T) -> R,
) -> PageBody<R> {
    page_of_some(page, caller, |i| Some(item(i)))
}

/// A page whose items the caller may not all see: those rendered as `None` are left out
/// (the cursor still moves past them). Rows that cannot be read are named to operators and
/// left out for everyone else.
pub fn page_of_some<'p, T, R>(
    page: &'p Page<T>,
    caller: &Caller,
    item: impl Fn(&'p T) -> Option<R>,
) -> PageBody<R> {
    let unreadable = match caller.is_operator() {
        true => page
            .unreadable
            .iter()
            .map(|row| UnreadableKeyBody {
                key: row.key.clone(),
                detail: format!("this row cannot be read: {}", row.error),
            })
            .collect(),
        false => Vec::new(),
    };
    PageBody {
        items: page.items.iter().filter_map(item).collect(),
        next_cursor: page.next_cursor.clone(),
        unreadable,
    }
}

/// A page of the events feed: the events and where to resume (always given).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FeedBody<R> {
    items: Vec<R>,
    next_cursor: String,
}

pub fn feed<R>(items: Vec<R>, next_cursor: String) -> FeedBody<R> {
    FeedBody { items, next_cursor }
}

/// A row of an audit listing, or an audit event, as a caller may see it.
#[derive(Serialize)]
#[serde(untagged)]
pub enum AuditRowBody<'a> {
    /// Every field, the hash inputs included (operators).
    Full(&'a AuditEvent),
    /// The event without who else sees it (a principal of it).
    Principal(Value),
    OwnVms(OwnVmsEventBody<'a>),
    Hidden(HiddenEventBody),
    Unreadable(UnreadableRowBody),
}

/// What an org whose VMs an event terminated sees of it: only that part.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnVmsEventBody<'a> {
    seq: i64,
    id: &'a str,
    at: String,
    action: &'a str,
    org_id: String,
    unit_ids: Vec<String>,
    terminated: Vec<String>,
    skipped: &'a [String],
    view: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vm_id: Option<&'a str>,
    /// The deadlines the event gave the caller's own VMs.
    #[serde(skip_serializing_if = "Option::is_none")]
    deadlines: Option<BTreeMap<&'a str, String>>,
}

#[derive(Serialize)]
pub struct HiddenEventBody {
    seq: i64,
    view: &'static str,
}

/// A row of the trail that cannot be read (it was damaged), as operators see it.
#[derive(Serialize)]
pub struct UnreadableRowBody {
    seq: i64,
    unreadable: bool,
    detail: String,
}

/// A row of an audit listing as `caller` may see it: an unreadable row (the trail was
/// damaged) shows operators its sequence number and what is wrong; an org, which cannot be
/// told whether it was a party of it, sees nothing of it (`None`).
pub fn audit_row<'a>(row: &'a Listed, caller: &Caller) -> Option<AuditRowBody<'a>> {
    match row {
        Listed::Event(event) => Some(audit_event(event, caller)),
        Listed::Unreadable { seq, error } if caller.is_operator() => {
            Some(AuditRowBody::Unreadable(UnreadableRowBody {
                seq: *seq,
                unreadable: true,
                detail: format!("this row cannot be read ({error}); see /v1/audit/verify"),
            }))
        }
        Listed::Unreadable { .. } => None,
    }
}

/// A row of the events feed as `caller` may see it: what the audit listing shows it, less
/// the audit trail's own content (the reason, who acted with which key and request, the
/// hashes) for a key that may not read the audit trail. Such an event is marked
/// `"view": "summary"`.
pub fn feed_row<'a>(row: &'a Listed, caller: &Caller) -> Option<AuditRowBody<'a>> {
    let rendered = audit_row(row, caller)?;
    if caller.has(Permission::AuditRead) {
        return Some(rendered);
    }
    Some(match rendered {
        AuditRowBody::Principal(mut event) => {
            if let Some(object) = event.as_object_mut() {
                for audit_only in [
                    "reason",
                    "actorKeyId",
                    "requestId",
                    "clientRequestId",
                    "hash",
                ] {
                    object.remove(audit_only);
                }
                object.insert("view".to_owned(), Value::from("summary"));
            }
            AuditRowBody::Principal(event)
        }
        other => other,
    })
}

/// An audit event as `caller` may see it (the rule is `reservations_domain::audit`):
/// operators get every field, the hash inputs included; a principal gets the event without
/// who else sees it and without its places in the chain; an org whose VMs the event terminated gets only that part, marked
/// `"view": "own-vms"`.
pub fn audit_event<'a>(event: &'a AuditEvent, caller: &Caller) -> AuditRowBody<'a> {
    let audience = event.audience();
    match event_view(caller, &audience) {
        EventView::Full if caller.is_operator() => AuditRowBody::Full(event),
        EventView::Full => {
            let mut principal = serde_json::to_value(event).expect("an audit event serializes");
            if let Some(object) = principal.as_object_mut() {
                // Who else sees the event, and its places in the chain (which count what
                // happened on the node), are for operators, who see the whole chain.
                for verifier_only in [
                    "visibleTo",
                    "vmOwners",
                    "hashVersion",
                    "chainSeq",
                    "prevHash",
                    "afterSeq",
                    "seal",
                ] {
                    object.remove(verifier_only);
                }
            }
            AuditRowBody::Principal(principal)
        }
        EventView::OwnVms(share) => AuditRowBody::OwnVms(OwnVmsEventBody {
            seq: event.seq,
            id: &event.id,
            at: to_rfc3339(event.at),
            action: &event.action,
            org_id: share.org_id.clone(),
            unit_ids: share.unit_ids.clone(),
            terminated: share.vm_ids.clone(),
            skipped: &[],
            view: "own-vms",
            node_id: event.node_id.as_deref(),
            vm_id: event
                .vm_id
                .as_deref()
                .filter(|vm| share.vm_ids.iter().any(|own| own == vm)),
            deadlines: Some(
                event
                    .deadlines
                    .iter()
                    .filter(|(vm, _)| share.vm_ids.contains(vm))
                    .map(|(vm, at)| (vm.as_str(), to_rfc3339(*at)))
                    .collect::<BTreeMap<_, _>>(),
            )
            .filter(|d| !d.is_empty()),
        }),
        // The store's filter already left such events out; should one slip through, it
        // says nothing.
        EventView::Hidden => AuditRowBody::Hidden(HiddenEventBody {
            seq: event.seq,
            view: "hidden",
        }),
    }
}

/// Who the caller is: its key, its org (none for operators) and what it may do.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoamiBody<'a> {
    key_id: &'a str,
    org_id: Option<&'a str>,
    operator: bool,
    permissions: Vec<&'static str>,
}

pub fn whoami(caller: &Caller) -> WhoamiBody<'_> {
    WhoamiBody {
        key_id: &caller.key_id,
        org_id: caller.org_id.as_deref(),
        operator: caller.is_operator(),
        permissions: usable_permissions(caller)
            .iter()
            .map(|p| p.as_str())
            .collect(),
    }
}

/// A healthy app: what was checked, the schema version, and the server's time.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthBody {
    status: &'static str,
    schema_version: i64,
    checks: HealthChecks,
    time: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthChecks {
    sqlite: &'static str,
    key_value: &'static str,
    /// With several cells: each other cell's database by label, `ok` once migrated, else
    /// `unavailable` (its nodes' requests fail; the others are served).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    cells: std::collections::BTreeMap<String, &'static str>,
}

/// Health: `cells` says whether each cell but the directory's could be migrated.
pub fn healthy(
    schema_version: i64,
    cells: std::collections::BTreeMap<String, bool>,
    now: Timestamp,
) -> HealthBody {
    HealthBody {
        status: "ok",
        schema_version,
        checks: HealthChecks {
            sqlite: "ok",
            key_value: "ok",
            cells: cells
                .into_iter()
                .map(|(label, ok)| (label, if ok { "ok" } else { "unavailable" }))
                .collect(),
        },
        time: to_rfc3339(now),
    }
}

// ============================================================================================
// The response
//
// Writing a response: a handler's [`Reply`], or a [`Problem`], as JSON with the request id.

/// A successful answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
    /// A member of the body shown to this caller once and never stored, not even in an
    /// idempotency record: a replay answers without it (see [`Reply::as_recorded`]).
    pub shown_once: Option<&'static str>,
}

fn to_json(body: impl Serialize) -> Value {
    serde_json::to_value(body).expect("a response body serializes")
}

impl Reply {
    fn with_status(status: u16, body: Option<Value>) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
            shown_once: None,
        }
    }

    pub fn ok(body: impl Serialize) -> Reply {
        Reply::with_status(200, Some(to_json(body)))
    }

    pub fn created(body: impl Serialize, location: String) -> Reply {
        let mut reply = Reply::with_status(201, Some(to_json(body)));
        reply.headers.push(("location", location));
        reply
    }

    pub fn no_content() -> Reply {
        Reply::with_status(204, None)
    }

    /// Marks `member` of the body as a secret shown once (an API key's token).
    pub fn with_secret_shown_once(mut self, member: &'static str) -> Reply {
        self.shown_once = Some(member);
        self
    }

    /// The body as an idempotency record keeps it: a secret shown once is left out, and
    /// `<member>Withheld: true` says so to whoever gets the replay.
    pub(crate) fn as_recorded(&self) -> Option<String> {
        let mut body = self.body.clone()?;
        if let (Some(member), Some(object)) = (self.shown_once, body.as_object_mut())
            && object.remove(member).is_some()
        {
            object.insert(format!("{member}Withheld"), Value::Bool(true));
        }
        Some(body.to_string())
    }
}

/// A response with the headers every JSON answer carries, and `body` typed `content_type`.
pub(crate) fn json_response(
    status: u16,
    content_type: &str,
    body: Option<String>,
    request_id: &str,
) -> ResponseBuilder {
    let mut builder = Response::builder();
    builder
        .status(status)
        .header(REQUEST_ID_HEADER, request_id)
        .header("cache-control", "no-store");
    if let Some(body) = body {
        builder.header("content-type", content_type).body(body);
    }
    builder
}

pub fn problem_response(problem: &Problem, request_id: &str, instance: &str) -> Response {
    crate::request_log::problem(problem.code);
    let mut builder = json_response(
        problem.status,
        PROBLEM_CONTENT_TYPE,
        Some(problem.body(request_id, instance).to_string()),
        request_id,
    );
    for (name, value) in &problem.headers {
        builder.header(*name, value.as_str());
    }
    builder.build()
}

fn reply_response(reply: &Reply, request_id: &str) -> Response {
    let mut builder = json_response(
        reply.status,
        "application/json",
        reply.body.as_ref().map(Value::to_string),
        request_id,
    );
    for (name, value) in &reply.headers {
        builder.header(*name, value.as_str());
    }
    builder.build()
}

/// The response to a handler's outcome.
pub(crate) fn outcome_response(
    outcome: &Result<Reply, Problem>,
    request_id: &str,
    instance: &str,
) -> Response {
    match outcome {
        Ok(reply) => reply_response(reply, request_id),
        Err(problem) => problem_response(problem, request_id, instance),
    }
}
