//! The API's JSON representations, camelCase exactly as in the seed.

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_domain::audit::{EventView, event_view};
use reservations_domain::market::Offer;
use reservations_domain::reservation::Reservation;
use reservations_domain::time::to_rfc3339;
use reservations_domain::vm::Vm;
use reservations_store::Page;
use reservations_store::audit::{AuditEvent, Listed};
use reservations_store::capacity::{CapacityOutcome, Representation};
use reservations_store::keys::{ApiKey, OperatorKey};
use reservations_store::nodes::{Node, NodeSummary};
use reservations_store::orgs::Org;
use serde_json::{Map, Value, json};

fn insert_opt(map: &mut Map<String, Value>, key: &str, value: Option<impl Into<Value>>) {
    if let Some(value) = value {
        map.insert(key.to_owned(), value.into());
    }
}

/// A reservation as the seed's response schema describes it, its status derived at `now`.
pub fn reservation(r: &Reservation, now: Timestamp) -> Map<String, Value> {
    reservation_with(r, now, Representation::Full)
}

/// A reservation, without `reservedUnitIds` and `releasedUnitIds` in the minimal representation.
pub fn reservation_with(
    r: &Reservation,
    now: Timestamp,
    representation: Representation,
) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("id".into(), json!(r.id));
    map.insert("nodeId".into(), json!(r.node_id));
    map.insert("status".into(), json!(r.status(now).as_str()));
    if representation == Representation::Full {
        map.insert("reservedUnitIds".into(), json!(r.reserved_unit_ids));
        map.insert("releasedUnitIds".into(), json!(r.released_unit_ids));
    }
    map.insert("allowedOrgIds".into(), json!(r.allowed_org_ids));
    map.insert("managingOrgIds".into(), json!(r.managing_org_ids));
    map.insert("startsAt".into(), json!(to_rfc3339(r.term.starts_at)));
    insert_opt(&mut map, "endsAt", r.term.ends_at.map(to_rfc3339));
    insert_opt(&mut map, "contractRef", r.contract_ref.clone());
    insert_opt(&mut map, "reason", r.reason.clone());
    map.insert("topologyGen".into(), json!(r.topology_gen));
    map.insert("createdAt".into(), json!(to_rfc3339(r.created_at)));
    map.insert("updatedAt".into(), json!(to_rfc3339(r.updated_at)));
    map
}

/// The reservation plus what a reclaim did (`terminated`, `skipped`) or what its dry run
/// would do (`wouldTerminate`, `wouldSkip`).
pub fn reclaim_outcome(outcome: &CapacityOutcome, now: Timestamp, dry_run: bool) -> Value {
    let plan = &outcome.plan;
    let mut map = reservation_with(&outcome.reservation, now, outcome.representation);
    let (terminate_key, skip_key) = if dry_run {
        ("wouldTerminate", "wouldSkip")
    } else {
        ("terminated", "skipped")
    };
    map.insert(terminate_key.into(), json!(plan.terminate));
    map.insert(skip_key.into(), json!(plan.skip));
    Value::Object(map)
}

pub fn node_summary(n: &NodeSummary) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("id".into(), json!(n.id));
    map.insert("ownerOrgId".into(), json!(n.owner_org_id));
    map.insert("topologyGen".into(), json!(n.topology_gen));
    map.insert("unitCount".into(), json!(n.unit_count));
    map.insert("createdAt".into(), json!(to_rfc3339(n.created_at)));
    map.insert("updatedAt".into(), json!(to_rfc3339(n.updated_at)));
    map
}

pub fn node(n: &Node) -> Value {
    let mut map = node_summary(&n.summary);
    map.insert("unitIds".into(), json!(n.unit_ids));
    Value::Object(map)
}

/// A node with how many of its units are on the spot market right now (released and idle).
pub fn node_with_sales(n: &Node, released_idle_units: i64) -> Value {
    let mut value = node(n);
    value["releasedIdleUnitCount"] = json!(released_idle_units);
    value
}

/// A unit for sale: the node, the unit, the tier it sells at, and until when (the term's end,
/// absent when open-ended). Nothing else about the reservation.
pub fn offer(o: &Offer) -> Value {
    let mut map = Map::new();
    map.insert("nodeId".into(), json!(o.node_id));
    map.insert("unitId".into(), json!(o.unit_id));
    map.insert("tier".into(), json!("spot"));
    insert_opt(&mut map, "endsAt", o.until.map(to_rfc3339));
    Value::Object(map)
}

pub fn vm(v: &Vm) -> Value {
    let mut map = Map::new();
    map.insert("id".into(), json!(v.id));
    map.insert("orgId".into(), json!(v.org_id));
    map.insert("nodeId".into(), json!(v.node_id));
    map.insert("unitIds".into(), json!(v.unit_ids));
    map.insert("tier".into(), json!(v.tier.as_str()));
    map.insert("status".into(), json!(v.status.as_str()));
    insert_opt(
        &mut map,
        "terminationReason",
        v.termination_reason.map(|r| r.as_str()),
    );
    map.insert("createdAt".into(), json!(to_rfc3339(v.created_at)));
    insert_opt(&mut map, "terminatedAt", v.terminated_at.map(to_rfc3339));
    Value::Object(map)
}

pub fn org(o: &Org) -> Value {
    json!({
        "id": o.id,
        "name": o.name,
        "createdAt": to_rfc3339(o.created_at),
    })
}

/// A key as listings show it: never the secret, nor its hash.
pub fn api_key(k: &ApiKey) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("id".into(), json!(k.id));
    map.insert("orgId".into(), json!(k.org_id));
    map.insert("name".into(), json!(k.name));
    map.insert("role".into(), json!(k.role.as_str()));
    map.insert(
        "permissions".into(),
        json!(
            k.effective_permissions()
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
        ),
    );
    insert_opt(
        &mut map,
        "explicitPermissions",
        k.permissions
            .as_ref()
            .map(|list| json!(list.iter().map(|p| p.as_str()).collect::<Vec<_>>())),
    );
    map.insert(
        "status".into(),
        json!(if k.revoked_at.is_some() {
            "revoked"
        } else {
            "active"
        }),
    );
    map.insert("createdAt".into(), json!(to_rfc3339(k.created_at)));
    map.insert("createdBy".into(), json!(k.created_by));
    insert_opt(&mut map, "revokedAt", k.revoked_at.map(to_rfc3339));
    map
}

/// An operator key as listings show it: never the secret, nor its hash.
pub fn operator_key(k: &OperatorKey) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("id".into(), json!(k.id));
    map.insert("name".into(), json!(k.name));
    map.insert("operator".into(), json!(true));
    map.insert(
        "status".into(),
        json!(if k.revoked_at.is_some() {
            "revoked"
        } else {
            "active"
        }),
    );
    map.insert("createdAt".into(), json!(to_rfc3339(k.created_at)));
    map.insert("createdBy".into(), json!(k.created_by));
    insert_opt(&mut map, "revokedAt", k.revoked_at.map(to_rfc3339));
    map
}

/// `{ "items": [...], "nextCursor": "..." }`.
pub fn page<T>(page: &Page<T>, item: impl Fn(&T) -> Value) -> Value {
    page_of_some(page, |i| Some(item(i)))
}

/// A page whose items the caller may not all see: those rendered as `None` are left out
/// (the cursor still moves past them).
pub fn page_of_some<T>(page: &Page<T>, item: impl Fn(&T) -> Option<Value>) -> Value {
    let mut map = Map::new();
    map.insert(
        "items".into(),
        Value::Array(page.items.iter().filter_map(item).collect()),
    );
    insert_opt(&mut map, "nextCursor", page.next_cursor.clone());
    Value::Object(map)
}

/// A row of an audit listing as `caller` may see it: an unreadable row (the trail was
/// damaged) shows operators its sequence number and what is wrong; an org, which cannot be
/// told whether it was a party of it, sees nothing of it (`None`).
pub fn audit_row(row: &Listed, caller: &Caller) -> Option<Value> {
    match row {
        Listed::Event(event) => Some(audit_event(event, caller)),
        Listed::Unreadable { seq, error } if caller.is_operator() => Some(json!({
            "seq": seq,
            "unreadable": true,
            "detail": format!("this row cannot be read ({error}); see /v1/audit/verify"),
        })),
        Listed::Unreadable { .. } => None,
    }
}

/// An audit event as `caller` may see it (the rule is `reservations_domain::audit`):
/// operators get every field, the hash inputs included; a principal gets the event without
/// who else sees it; an org whose VMs the event terminated gets only that part, marked
/// `"view": "own-vms"`; anyone else gets `None` (the store lists no such event).
pub fn audit_event(event: &AuditEvent, caller: &Caller) -> Value {
    let audience = event.audience();
    let mut full = serde_json::to_value(event).expect("an audit event serializes");
    let object = full.as_object_mut().expect("an event is an object");
    match event_view(caller, &audience) {
        EventView::Full if caller.is_operator() => full,
        EventView::Full => {
            for verifier_only in ["visibleTo", "vmOwners", "hashVersion"] {
                object.remove(verifier_only);
            }
            full
        }
        EventView::OwnVms(share) => {
            let mut own = json!({
                "seq": event.seq,
                "id": event.id,
                "at": to_rfc3339(event.at),
                "action": event.action,
                "orgId": share.org_id,
                "unitIds": share.unit_ids,
                "terminated": share.vm_ids,
                "skipped": [],
                "view": "own-vms",
            });
            if let Some(node) = &event.node_id {
                own["nodeId"] = json!(node);
            }
            if let Some(vm) = event.vm_id.as_ref().filter(|vm| share.vm_ids.contains(vm)) {
                own["vmId"] = json!(vm);
            }
            own
        }
        // The store's filter already left such events out; should one slip through, it
        // says nothing.
        EventView::Hidden => json!({ "seq": event.seq, "view": "hidden" }),
    }
}
