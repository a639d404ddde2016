//! The authorization sweep: every route × every kind of caller against a table of expected
//! statuses. The table must cover exactly the (method, route) pairs of the app's route table
//! (`reservations_http::routes`), so a new route cannot be added without deciding who may call it.
//!
//! One world serves every row: org `owner` owns node `n1`, whose active reservation has the
//! audience `aud` and the managing org `mgr`, with released units and a spot VM of `aud` on
//! one of them; `stranger` has no part in any of it. The operator calls both with the
//! bootstrap credential and with an operator key made through the API. Rows whose allowed calls change state
//! make a fresh object for every call.
//!
//! Wherever a row expects 404, the same request naming objects that do not exist must get
//! the same answer: a refusal must not tell an existing object from a missing one. And a
//! refused call changes nothing in the database, not even the audit trail.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::routes::served_routes;
use api_support::{App, Client, ReleaseSpec, Reply, ReservationSpec, Scenario, rfc3339_from_now};

/// The kinds of caller, in the column order of [`ROWS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    /// No Authorization header.
    Nobody,
    /// A revoked admin key of the owner org.
    Revoked,
    /// An admin key of an org with no part in the world.
    Stranger,
    /// An admin key of the reservation's audience org (also the fixture VM's org).
    Audience,
    /// An admin key of an org in the reservation's `managingOrgIds`.
    Manager,
    OwnerAdmin,
    OwnerCapacityManager,
    OwnerMember,
    OwnerViewer,
    /// The bootstrap operator credential.
    Operator,
    /// An operator key created through the API.
    OperatorKey,
}

const CALLERS: [Who; 11] = [
    Who::Nobody,
    Who::Revoked,
    Who::Stranger,
    Who::Audience,
    Who::Manager,
    Who::OwnerAdmin,
    Who::OwnerCapacityManager,
    Who::OwnerMember,
    Who::OwnerViewer,
    Who::Operator,
    Who::OperatorKey,
];

const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
const MANAGER: &str = "mgr";
const STRANGER: &str = "stranger";
const NODE: &str = "n1";
const MARKET_NODE: &str = "n-market";
const TOPOLOGY_NODE: &str = "n-topo";
/// Units of the main reservation: `r-00`..`r-29` released, the rest reserved only.
const RESERVED_UNITS: usize = 60;
const RELEASED_UNITS: usize = 30;
/// Units of `n1` outside any reservation, for fresh reservations.
const FREE_UNITS: usize = 40;
const MARKET_UNITS: usize = 20;

fn unit(prefix: &str, n: usize) -> String {
    format!("{prefix}-{n:02}")
}

/// The world every row runs against.
struct World {
    app: App,
    callers: BTreeMap<Who, Client>,
    reservation_id: String,
    needs_review_id: String,
    victim_key_id: String,
    victim_operator_key_id: String,
    n1_units: Vec<String>,
    next_free: Cell<usize>,
    next_released: Cell<usize>,
    next_reserved: Cell<usize>,
    next_market: Cell<usize>,
    next_id: Cell<usize>,
    topology_units: Cell<usize>,
    /// The audience's spot VM on the released `r-00`, placed once for the read rows.
    fixture_vm: String,
}

/// Takes the next number of a pool, failing loudly when a pool runs dry.
fn take(counter: &Cell<usize>, end: usize, pool: &str) -> usize {
    let n = counter.get();
    assert!(n < end, "the {pool} pool ran dry; make it larger");
    counter.set(n + 1);
    n
}

impl World {
    fn build() -> World {
        let mut n1_units: Vec<String> = (0..RESERVED_UNITS).map(|n| unit("r", n)).collect();
        n1_units.extend((0..FREE_UNITS).map(|n| unit("f", n)));
        let n1_refs: Vec<&str> = n1_units.iter().map(String::as_str).collect();
        let market: Vec<String> = (0..MARKET_UNITS).map(|n| unit("m", n)).collect();
        let reserved: Vec<&str> = n1_refs[..RESERVED_UNITS].to_vec();
        let scene = Scenario::new()
            .orgs(&[OWNER, AUDIENCE, MANAGER, STRANGER])
            .node(NODE, OWNER, &n1_refs)
            .node(
                MARKET_NODE,
                OWNER,
                &market.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .reservation(
                "reserved",
                ReservationSpec::on(NODE, &reserved)
                    .audience(&[AUDIENCE])
                    .managers(&[MANAGER]),
            )
            .release(ReleaseSpec::of("reserved", &reserved[..RELEASED_UNITS]).reason("sweep"))
            // A reservation under review: its node's unit set changes after it is made.
            .node(TOPOLOGY_NODE, OWNER, &["t-0"])
            .reservation(
                "under review",
                ReservationSpec::on(TOPOLOGY_NODE, &["t-0"])
                    .audience(&[AUDIENCE])
                    .managers(&[MANAGER]),
            )
            .open();
        let reservation_id = scene.reservation_id("reserved");
        let needs_review_id = scene.reservation_id("under review");
        let app = scene.app;
        let operator = app.operator();
        operator
            .put(
                &format!("/v1/nodes/{TOPOLOGY_NODE}"),
                &json!({ "ownerOrgId": OWNER, "unitIds": ["t-0", "t-1"] }),
            )
            .expect_status(200);
        let status = operator
            .get(&format!(
                "/v1/nodes/{TOPOLOGY_NODE}/reservations/{needs_review_id}"
            ))
            .expect_status(200)
            .json()["status"]
            .clone();
        assert_eq!(status, "needs-review");

        let revoked = operator
            .post(
                &format!("/v1/orgs/{OWNER}/keys"),
                &json!({ "name": "revoked", "role": "admin" }),
            )
            .expect_status(201)
            .json();
        operator
            .delete(&format!(
                "/v1/orgs/{OWNER}/keys/{}",
                revoked["id"].as_str().unwrap()
            ))
            .expect_status(200);
        let victim = operator
            .post(
                &format!("/v1/orgs/{OWNER}/keys"),
                &json!({ "name": "victim", "role": "viewer" }),
            )
            .expect_status(201)
            .json();

        let victim_operator_key = operator
            .post("/v1/operator/keys", &json!({ "name": "victim" }))
            .expect_status(201)
            .json();

        let callers = CALLERS
            .into_iter()
            .map(|who| {
                let client = match who {
                    Who::Nobody => app.anonymous(),
                    Who::Revoked => app.client(revoked["token"].as_str().unwrap()),
                    Who::Stranger => app.key(STRANGER, "admin", None),
                    Who::Audience => app.key(AUDIENCE, "admin", None),
                    Who::Manager => app.key(MANAGER, "admin", None),
                    Who::OwnerAdmin => app.key(OWNER, "admin", None),
                    Who::OwnerCapacityManager => app.key(OWNER, "capacity-manager", None),
                    Who::OwnerMember => app.key(OWNER, "member", None),
                    Who::OwnerViewer => app.key(OWNER, "viewer", None),
                    Who::Operator => app.operator(),
                    Who::OperatorKey => app.client(
                        operator
                            .post("/v1/operator/keys", &json!({ "name": "sweep operator" }))
                            .expect_status(201)
                            .json()["token"]
                            .as_str()
                            .unwrap(),
                    ),
                };
                (who, client)
            })
            .collect();

        let mut world = World {
            app,
            callers,
            reservation_id,
            needs_review_id,
            victim_key_id: victim["id"].as_str().unwrap().to_owned(),
            victim_operator_key_id: victim_operator_key["id"].as_str().unwrap().to_owned(),
            n1_units,
            next_free: Cell::new(0),
            next_released: Cell::new(1),
            next_reserved: Cell::new(RELEASED_UNITS),
            next_market: Cell::new(0),
            next_id: Cell::new(0),
            topology_units: Cell::new(2),
            fixture_vm: String::new(),
        };
        world.fixture_vm = world.place_vm("r-00", "spot");
        world
    }

    fn client(&self, who: Who) -> &Client {
        &self.callers[&who]
    }

    /// Places a VM of the audience; returns the id the server gave it.
    fn place_vm(&self, unit_id: &str, tier: &str) -> String {
        self.client(Who::Audience)
            .post(
                "/v1/vms",
                &json!({ "nodeId": NODE, "unitIds": [unit_id], "tier": tier }),
            )
            .created_id()
    }

    fn fresh_id(&self, prefix: &str) -> String {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        format!("{prefix}-sweep-{n}")
    }

    /// A body for a new reservation on a unit of `n1` no reservation holds.
    fn new_reservation_body(&self) -> Value {
        let n = take(&self.next_free, FREE_UNITS, "free unit");
        json!({
            "reservedUnitIds": [unit("f", n)],
            "allowedOrgIds": [AUDIENCE],
            "managingOrgIds": [MANAGER],
            "startsAt": rfc3339_from_now(-3600),
        })
    }

    /// A new active reservation of `n1`, made by the operator.
    fn fresh_reservation(&self) -> String {
        self.client(Who::Operator)
            .post(
                &format!("/v1/nodes/{NODE}/reservations"),
                &self.new_reservation_body(),
            )
            .expect_status(201)
            .json()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The reservation of `n-topo`, put under review (again) by a change of the node's units.
    fn under_review(&self) -> Call {
        let count = self.topology_units.get() + 1;
        self.topology_units.set(count);
        let units: Vec<String> = (0..count).map(|n| format!("t-{n}")).collect();
        self.client(Who::Operator)
            .put(
                &format!("/v1/nodes/{TOPOLOGY_NODE}"),
                &json!({ "ownerOrgId": OWNER, "unitIds": units }),
            )
            .expect_status(200);
        call(
            &[
                ("nodeId", TOPOLOGY_NODE),
                ("id", self.needs_review_id.as_str()),
            ],
            None,
        )
    }

    /// A new running spot VM of the audience on a released unit of the reservation.
    fn fresh_spot_vm(&self) -> String {
        let n = take(&self.next_released, RELEASED_UNITS, "released unit");
        self.place_vm(&unit("r", n), "spot")
    }

    /// A new running verified VM of the audience on a reserved, unreleased unit.
    fn fresh_verified_vm(&self) -> String {
        let n = take(&self.next_reserved, RESERVED_UNITS - 2, "reserved unit");
        self.place_vm(&unit("r", n), "verified")
    }
}

/// One call: its path parameters and its JSON body.
struct Call {
    params: Vec<(&'static str, String)>,
    body: Option<Value>,
}

fn call(params: &[(&'static str, &str)], body: Option<Value>) -> Call {
    Call {
        params: params.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        body,
    }
}

fn no_params(body: Option<Value>) -> Call {
    call(&[], body)
}

fn in_reservation(world: &World, body: Option<Value>) -> Call {
    call(
        &[("nodeId", NODE), ("id", world.reservation_id.as_str())],
        body,
    )
}

struct Row {
    method: &'static str,
    /// Exactly as in spin.toml.
    route: &'static str,
    /// What this row exercises, when a route has several rows.
    case: &'static str,
    /// In [`CALLERS`] order.
    expect: [u16; 11],
    call: fn(&World) -> Call,
}

#[rustfmt::skip]
const ROWS: &[Row] = &[
    // Columns: nobody, revoked key, stranger, audience, manager, owner admin, owner capacity-manager,
    // owner member, owner viewer, operator (bootstrap credential), operator key.
    //             none  rvkd  strg  aud   mgr   o-ad  o-cm  o-mb  o-vw  op    opk
    Row { method: "GET", route: "/v1/healthz", case: "public",
          expect: [200,  200,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    Row { method: "GET", route: "/v1/openapi.json", case: "public",
          expect: [200,  200,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    // The console: one HTML page and its assets, the same bytes for everyone (it reads no
    // state; the page then calls the API with the key a person pastes).
    Row { method: "GET", route: "/console", case: "the page",
          expect: [200,  200,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    Row { method: "GET", route: "/console/...", case: "an asset",
          expect: [200,  200,  200,  200,  200,  200,  200,  200,  200,  200,  200],
          call: |_| call(&[("...", "js/main.js")], None) },
    Row { method: "GET", route: "/console/...", case: "a file it does not have",
          expect: [404,  404,  404,  404,  404,  404,  404,  404,  404,  404,  404],
          call: |_| call(&[("...", "ghost")], None) },
    Row { method: "GET", route: "/v1/whoami", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    // Orgs are the operator's business.
    Row { method: "POST", route: "/v1/orgs", case: "",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  201,  201],
          call: |_| no_params(Some(json!({ "name": "Made by the sweep" }))) },
    Row { method: "GET", route: "/v1/orgs/:orgId", case: "the owner org",
          expect: [401,  401,  404,  404,  404,  200,  200,  200,  200,  200,  200],
          call: |_| call(&[("orgId", OWNER)], None) },
    // Keys: apikey.manage in the org itself; other orgs cannot tell the org exists.
    Row { method: "POST", route: "/v1/orgs/:orgId/keys", case: "a viewer key of the owner org",
          expect: [401,  401,  404,  404,  404,  201,  403,  403,  403,  201,  201],
          call: |_| call(&[("orgId", OWNER)], Some(json!({ "name": "sweep", "role": "viewer" }))) },
    Row { method: "GET", route: "/v1/orgs/:orgId/keys", case: "the owner org's keys",
          expect: [401,  401,  404,  404,  404,  200,  403,  403,  403,  200,  200],
          call: |_| call(&[("orgId", OWNER)], None) },
    // Revoking a revoked key is a 200 that changes nothing, so one victim serves every call.
    Row { method: "DELETE", route: "/v1/orgs/:orgId/keys/:keyId", case: "a key of the owner org",
          expect: [401,  401,  404,  404,  404,  200,  403,  403,  403,  200,  200],
          call: |w| call(&[("orgId", OWNER), ("keyId", w.victim_key_id.as_str())], None) },
    // Operator keys: operators only, and an org key learns nothing more than that.
    Row { method: "POST", route: "/v1/operator/keys", case: "",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  201,  201],
          call: |_| no_params(Some(json!({ "name": "sweep" }))) },
    Row { method: "GET", route: "/v1/operator/keys", case: "",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  200,  200], call: |_| no_params(None) },
    Row { method: "DELETE", route: "/v1/operator/keys/:keyId", case: "",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  200,  200],
          call: |w| call(&[("keyId", w.victim_operator_key_id.as_str())], None) },
    // Nodes are the market's listings.
    Row { method: "GET", route: "/v1/nodes", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    Row { method: "GET", route: "/v1/nodes/:nodeId", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200],
          call: |_| call(&[("nodeId", NODE)], None) },
    Row { method: "PUT", route: "/v1/nodes/:nodeId", case: "update, same owner and units",
          expect: [401,  401,  403,  403,  403,  200,  200,  403,  403,  200,  200],
          call: |w| call(&[("nodeId", NODE)], Some(json!({ "ownerOrgId": OWNER, "unitIds": w.n1_units }))) },
    Row { method: "PUT", route: "/v1/nodes/:nodeId", case: "register a new node",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  201,  201],
          call: |w| Call {
              params: vec![("nodeId", w.fresh_id("n"))],
              body: Some(json!({ "ownerOrgId": OWNER, "unitIds": ["g-0"] })),
          } },
    // The spot market: every key with node.read, whatever its part in the reservations.
    Row { method: "GET", route: "/v1/market", case: "every node's units for sale",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    // Reservations: written by the owner (and operators), read by every party.
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations", case: "a fresh unit of the owner's node",
          expect: [401,  401,  404,  404,  404,  201,  201,  403,  403,  201,  201],
          call: |w| call(&[("nodeId", NODE)], Some(w.new_reservation_body())) },
    Row { method: "GET", route: "/v1/nodes/:nodeId/reservations", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200],
          call: |_| call(&[("nodeId", NODE)], None) },
    Row { method: "GET", route: "/v1/nodes/:nodeId/reservations/:id", case: "",
          expect: [401,  401,  404,  200,  200,  200,  200,  200,  200,  200,  200],
          call: |w| in_reservation(w, None) },
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/cancel", case: "a fresh reservation",
          expect: [401,  401,  404,  403,  403,  200,  200,  403,  403,  200,  200],
          call: |w| call(&[("nodeId", NODE), ("id", w.fresh_reservation().as_str())], Some(json!({ "reason": "sweep" }))) },
    // Every call finds the reservation under review again.
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/reaffirm", case: "a reservation under review",
          expect: [401,  401,  404,  403,  403,  403,  403,  403,  403,  200,  200],
          call: World::under_review },
    // Capacity: without reservation.capacity, 404 exactly as for a missing reservation.
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/release", case: "a reserved unit",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": [unit("r", RESERVED_UNITS - 1)] }))) },
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/reclaim", case: "a reserved unit",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": [unit("r", RESERVED_UNITS - 2)] }))) },
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run", case: "the fixture VM's unit",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": ["r-00"] }))) },
    // Notice and timed release change nothing about who may call.
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/release", case: "a reserved unit, until a time",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": [unit("r", RESERVED_UNITS - 3)], "until": rfc3339_from_now(86_400) }))) },
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/reclaim", case: "a reserved unit, with notice",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": [unit("r", RESERVED_UNITS - 4)], "noticeSeconds": 120 }))) },
    Row { method: "POST", route: "/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run", case: "the fixture VM's unit, with notice",
          expect: [401,  401,  404,  403,  200,  200,  200,  404,  404,  200,  200],
          call: |w| in_reservation(w, Some(json!({ "unitIds": ["r-00"], "noticeSeconds": 120 }))) },
    // VMs: org keys with vm.write place them; operators have no org to run one for.
    Row { method: "POST", route: "/v1/vms", case: "spot on a free unit",
          expect: [401,  401,  201,  201,  201,  201,  403,  201,  403,  403,  403],
          call: |w| {
              let n = take(&w.next_market, MARKET_UNITS, "market unit");
              no_params(Some(json!({ "nodeId": MARKET_NODE, "unitIds": [unit("m", n)], "tier": "spot" })))
          } },
    Row { method: "GET", route: "/v1/vms", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
    Row { method: "GET", route: "/v1/vms/:id", case: "the audience's spot VM on a released unit",
          expect: [401,  401,  404,  200,  200,  200,  200,  200,  200,  200,  200],
          call: |w| call(&[("id", w.fixture_vm.as_str())], None) },
    // Capacity managers terminate spot VMs on their units with reservation.capacity...
    Row { method: "DELETE", route: "/v1/vms/:id", case: "a fresh spot VM of the audience on a released unit",
          expect: [401,  401,  404,  200,  200,  200,  200,  403,  403,  200,  200],
          call: |w| call(&[("id", w.fresh_spot_vm().as_str())], None) },
    // ...but never a verified one.
    Row { method: "DELETE", route: "/v1/vms/:id", case: "a fresh verified VM of the audience on a reserved unit",
          expect: [401,  401,  404,  200,  403,  403,  403,  403,  403,  200,  200],
          call: |w| call(&[("id", w.fresh_verified_vm().as_str())], None) },
    // Orgs read the events about their own objects; verifying the chain is for operators.
    Row { method: "GET", route: "/v1/audit", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  403,  403,  200,  200], call: |_| no_params(None) },
    Row { method: "GET", route: "/v1/audit/verify", case: "",
          expect: [401,  401,  403,  403,  403,  403,  403,  403,  403,  200,  200], call: |_| no_params(None) },
    // The events feed: every role (vm.read or reservation.read), each seeing its own part.
    Row { method: "GET", route: "/v1/events", case: "",
          expect: [401,  401,  200,  200,  200,  200,  200,  200,  200,  200,  200], call: |_| no_params(None) },
];

/// The route with its `:name` segments (and a trailing wildcard `...`) filled in.
fn fill(route: &str, params: &[(&'static str, String)]) -> String {
    route
        .split('/')
        .map(|segment| {
            match segment
                .strip_prefix(':')
                .or((segment == "...").then_some(segment))
            {
                Some(name) => params
                    .iter()
                    .find(|(k, _)| *k == name)
                    .unwrap_or_else(|| panic!("no value for :{name} of {route}"))
                    .1
                    .clone(),
                None => segment.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn send(client: &Client, method: &str, path: &str, body: Option<&Value>) -> Reply {
    match body {
        Some(body) => client.send(
            method,
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        ),
        None => client.send(method, path, None, None),
    }
}

/// What is wrong with a reply that has the expected status, if anything.
fn shape_error(route: &str, reply: &Reply) -> Option<String> {
    let content_type = reply.header("content-type").unwrap_or("");
    if !route.starts_with("/v1/") {
        // The console: every answer, refusals too, carries the page's security headers.
        let csp = reply.header("content-security-policy").unwrap_or("");
        if !csp.starts_with("default-src 'self';") || csp.contains("unsafe") {
            return Some(format!("content-security-policy {csp:?}"));
        }
        if reply.header("x-content-type-options") != Some("nosniff")
            || reply.header("referrer-policy") != Some("no-referrer")
        {
            return Some("no nosniff or no-referrer".into());
        }
        if reply.status < 300 {
            return (content_type.is_empty() || content_type.contains("json"))
                .then(|| format!("a console file typed {content_type:?}"));
        }
    }
    if reply.status < 300 {
        return (!content_type.starts_with("application/json"))
            .then(|| format!("content type {content_type:?}"));
    }
    if content_type != "application/problem+json" {
        return Some(format!(
            "a {} that is not a problem: {content_type:?}",
            reply.status
        ));
    }
    let code = reply.json()["code"].as_str().unwrap_or("").to_owned();
    let want = match reply.status {
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not-found",
        _ => return None,
    };
    if code != want {
        return Some(format!("code {code:?}, want {want:?}"));
    }
    if reply.status == 401
        && !reply
            .header("www-authenticate")
            .is_some_and(|c| c.starts_with("Bearer"))
    {
        return Some("a 401 without WWW-Authenticate: Bearer".into());
    }
    None
}

/// A digest of every row of every table of the app's database.
fn database_fingerprint(app: &App) -> String {
    let db = app.db();
    let mut tables = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let names: Vec<String> = tables
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut digest = Sha256::new();
    for name in names {
        digest.update(name.as_bytes());
        let mut rows = db.prepare(&format!("SELECT * FROM \"{name}\"")).unwrap();
        let columns = rows.column_count();
        let mut cursor = rows.query([]).unwrap();
        while let Some(row) = cursor.next().unwrap() {
            for i in 0..columns {
                let value: rusqlite::types::Value = row.get(i).unwrap();
                digest.update(format!("{value:?}\u{1f}").as_bytes());
            }
            digest.update(b"\n");
        }
    }
    hex::encode(digest.finalize())
}

/// The parts of a problem that must not tell an existing object from a missing one.
fn refusal(reply: &Reply) -> Value {
    let problem = reply.json();
    json!({
        "status": reply.status,
        "code": problem["code"],
        "title": problem["title"],
        "detail": problem["detail"],
    })
}

#[test]
fn every_route_answers_every_caller_as_the_table_says() {
    let world = World::build();
    let mut failures = Vec::new();
    let mut report = String::new();
    for row in ROWS {
        for (who, want) in CALLERS.into_iter().zip(row.expect) {
            let call = (row.call)(&world);
            let path = fill(row.route, &call.params);
            let before = (want >= 400).then(|| database_fingerprint(&world.app));
            let reply = send(world.client(who), row.method, &path, call.body.as_ref());
            if let Some(before) = before
                && database_fingerprint(&world.app) != before
            {
                failures.push(format!(
                    "{} {path} as {who:?}: a refused call wrote",
                    row.method
                ));
            }
            let label = format!("{} {} [{}] as {who:?}", row.method, path, row.case);
            writeln!(report, "{label}: {}", reply.status).unwrap();
            if reply.status != want {
                failures.push(format!(
                    "{label}: got {}, want {want}: {}",
                    reply.status,
                    reply.text()
                ));
                continue;
            }
            if let Some(error) = shape_error(row.route, &reply) {
                failures.push(format!("{label}: {error}: {}", reply.text()));
                continue;
            }
            if want == 404 {
                let ghost_params: Vec<(&'static str, String)> = call
                    .params
                    .iter()
                    .map(|(k, _)| (*k, "ghost".to_owned()))
                    .collect();
                let ghost_path = fill(row.route, &ghost_params);
                let ghost = send(
                    world.client(who),
                    row.method,
                    &ghost_path,
                    call.body.as_ref(),
                );
                if refusal(&ghost) != refusal(&reply) {
                    failures.push(format!(
                        "{label}: the refusal differs from the answer for {ghost_path}: {} vs {}",
                        reply.text(),
                        ghost.text()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} calls differ from the table:\n{}\n\nall calls:\n{report}",
        failures.len(),
        ROWS.len() * CALLERS.len(),
        failures.join("\n")
    );
}

#[test]
fn the_table_covers_exactly_the_served_routes() {
    let served = served_routes();
    assert!(served.len() >= 20, "parsed too few routes: {served:?}");
    let covered: BTreeSet<(String, String)> = ROWS
        .iter()
        .map(|row| (row.method.to_owned(), row.route.to_owned()))
        .collect();
    let missing: Vec<_> = served.difference(&covered).collect();
    let stale: Vec<_> = covered.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "routes without a row (decide who may call them): {missing:?}\nrows for routes nobody serves: {stale:?}"
    );
    let mut cases = BTreeSet::new();
    for row in ROWS {
        assert!(
            cases.insert((row.method, row.route, row.case)),
            "a repeated row: {} {} [{}]",
            row.method,
            row.route,
            row.case
        );
    }
}

/// Every other method on a served route is a 405 problem, before any authentication.
#[test]
fn other_methods_are_405() {
    let app = App::start();
    let served = served_routes();
    let mut failures = Vec::new();
    let routes: BTreeSet<&String> = served.iter().map(|(_, route)| route).collect();
    for route in routes {
        let path = route
            .split('/')
            .map(|s| if s.starts_with(':') { "x" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if served.contains(&(method.to_owned(), route.clone())) {
                continue;
            }
            for client in [app.operator(), app.anonymous()] {
                let reply = client.send(method, &path, Some("application/json"), Some(b"{}"));
                let code = serde_json::from_slice::<Value>(&reply.body)
                    .ok()
                    .and_then(|v| v["code"].as_str().map(str::to_owned));
                if reply.status != 405 || code.as_deref() != Some("method-not-allowed") {
                    failures.push(format!(
                        "{method} {path} ({}): {} {}",
                        if client.token().is_some() {
                            "operator"
                        } else {
                            "anonymous"
                        },
                        reply.status,
                        reply.text()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
