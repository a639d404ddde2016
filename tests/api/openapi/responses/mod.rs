//! A realistic scenario's every real response, successes and every kind of error, against
//! the document: a documented status, content type and headers, and a body that validates
//! against the documented schema.

use super::*;

mod audit;
mod capacity;
mod identity;
mod refusals;
mod reservations;

use audit::{audit, events_feed};
use capacity::{dry_run_and_reclaim, market, nodes, placements, release, vm_reads_and_termination};
use identity::{operator_keys, org_keys, orgs};
use refusals::{
    bodies_that_never_arrive_time_out_everywhere, strangers_and_bad_keys_are_refused_everywhere,
};
use reservations::{cancel, reservations, topology_change_and_reaffirm};

/// Orgs, keys, a node, reservations, release, VMs, dry run, reclaim, cancel, re-affirm,
/// audit, and errors of every kind, told once over one shared spec: every response is checked
/// against the document as it arrives, and at the end every documented (operation, status)
/// below 500 must have been seen, so the document claims nothing the app does not do.
#[test]
fn real_responses_match_the_document() {
    // A short body deadline, so that the 408s below take a second (bodies sent whole are
    // read within microseconds of their head).
    let app = App::start_with(|config| config.env("SPIN_VARIABLE_BODY_DEADLINE_MS", "1000"));
    let spec = Spec::new(repo_document());
    let anonymous = spec.caller(app.anonymous());
    let operator = spec.caller(app.operator());
    meta(&anonymous, &spec);
    orgs(&anonymous, &operator);
    let cast = Cast::new(&app, &spec, anonymous, operator);
    org_keys(&cast);
    operator_keys(&cast);
    nodes(&cast);
    market(&cast);
    let reservation = reservations(&cast);
    release(&cast, &reservation);
    let vms = placements(&cast, &reservation);
    dry_run_and_reclaim(&cast, &reservation, &vms);
    vm_reads_and_termination(&cast, &vms);
    topology_change_and_reaffirm(&cast, &reservation);
    cancel(&cast);
    audit(&cast, &reservation);
    events_feed(&cast);
    strangers_and_bad_keys_are_refused_everywhere(&cast);
    bodies_that_never_arrive_time_out_everywhere(&cast);
    let missing: Vec<_> = spec
        .documented_responses()
        .difference(&spec.seen())
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "documented but never seen (drop them from the document, or show them here): {missing:#?}"
    );
}

/// The callers of the story, each checking every answer against the document.
struct Cast<'s> {
    app: &'s App,
    spec: &'s Spec,
    anonymous: Client,
    operator: Client,
    owner: Client,
    owner_viewer: Client,
    owner_audit_only: Client,
    tenant: Client,
    tenant_capacity: Client,
    guest_capacity: Client,
}

impl<'s> Cast<'s> {
    fn new(app: &'s App, spec: &'s Spec, anonymous: Client, operator: Client) -> Self {
        let key =
            |org, role, permissions| spec.caller(issue(app, &operator, org, role, permissions));
        Cast {
            owner: key("owner", "admin", None),
            owner_viewer: key("owner", "viewer", None),
            owner_audit_only: key("owner", "admin", Some(&["audit.read"])),
            tenant: key("tenant", "member", None),
            tenant_capacity: key("tenant", "capacity-manager", None),
            guest_capacity: key("guest", "capacity-manager", None),
            app,
            spec,
            anonymous,
            operator,
        }
    }

    fn issue(&self, org: &str, role: &str, permissions: Option<&[&str]>) -> Client {
        issue(self.app, &self.operator, org, role, permissions)
    }
}

/// A new key of `org` with `role` (and `permissions`), issued by the operator.
fn issue(
    app: &App,
    operator: &Client,
    org: &str,
    role: &str,
    permissions: Option<&[&str]>,
) -> Client {
    let mut body = json!({ "name": format!("{org} {role}"), "role": role });
    if let Some(list) = permissions {
        body["permissions"] = json!(list);
    }
    let created = operator
        .post(&format!("/v1/orgs/{org}/keys"), &body)
        .expect_status(201)
        .json();
    app.client(created["token"].as_str().expect("token"))
}

/// A reservation of the story: its id and path.
struct Reservation {
    id: String,
    path: String,
}

/// The story's two VMs on the reservation: a spot one and a community one.
struct Vms {
    spot: String,
    community: String,
}

/// `method path` refuses a body of another media type than JSON (415) and one over its limit
/// (413).
fn media_and_size_are_refused(
    caller: &Client,
    method: &str,
    path: &str,
    (content_type, body): (Option<&str>, &[u8]),
    oversize: &[u8],
) {
    caller
        .send(method, path, content_type, Some(body))
        .expect_problem(415, "unsupported-media-type");
    caller
        .send(method, path, Some("application/json"), Some(oversize))
        .expect_problem(413, "payload-too-large");
}

/// A JSON body just over the default limit.
fn over_the_default_limit() -> String {
    json!({ "name": "x".repeat(70 * 1024) }).to_string()
}

/// A body just over the limit of the routes that take a node's unit list.
fn over_the_large_limit() -> Vec<u8> {
    vec![b' '; 9 * 1024 * 1024]
}

/// A capacity request just over the default limit.
fn capacity_over_the_default_limit() -> String {
    json!({ "unitIds": ["u0"], "reason": "r".repeat(65 * 1024) }).to_string()
}

/// Health and the document itself.
fn meta(anonymous: &Client, spec: &Spec) {
    anonymous.get("/v1/healthz").expect_status(200);
    let served = anonymous.get("/v1/openapi.json").expect_status(200).json();
    assert_eq!(
        served, spec.document,
        "the served document is docs/openapi.json"
    );
}
