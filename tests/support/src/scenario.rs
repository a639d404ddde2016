//! The fixtures of a suite, declared once and made through the API: orgs, nodes, keys,
//! reservations, released units, cancellations and VMs, in the order they are declared.
//!
//! ```ignore
//! let scene = Scenario::new()
//!     .orgs(&["owner", "aud", "mgr"])
//!     .node("n1", "owner", &["g0", "g1", "g2", "g3"])
//!     .key("owner", "owner", "capacity-manager")
//!     .reservation(
//!         "r",
//!         ReservationSpec::on("n1", &["g0", "g1"]).audience(&["aud"]).managers(&["mgr"]),
//!     )
//!     .release(ReleaseSpec::of("r", &["g1"]).by("owner").reason("idle"))
//!     .open();
//! let owner = scene.client("owner");
//! let path = scene.reservation_path("r");
//! ```

use std::collections::HashMap;
use std::ops::Deref;

use api_client::Client;
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::rfc3339_from_now;
use crate::vms::placed_vm;

/// A reservation to make: on `node`, of `units`, active since an hour ago and open-ended
/// unless told otherwise, made by the operator unless `made_by` names a key.
#[derive(Clone, Debug)]
pub struct ReservationSpec {
    node: String,
    units: Vec<String>,
    audience: Vec<String>,
    managers: Vec<String>,
    starts_in: i64,
    ends_in: Option<i64>,
    contract_ref: Option<String>,
    reason: Option<String>,
    made_by: Option<String>,
}

impl ReservationSpec {
    pub fn on(node: &str, units: &[&str]) -> ReservationSpec {
        ReservationSpec {
            node: node.to_owned(),
            units: owned(units),
            audience: Vec::new(),
            managers: Vec::new(),
            starts_in: -3600,
            ends_in: None,
            contract_ref: None,
            reason: None,
            made_by: None,
        }
    }

    pub fn audience(mut self, orgs: &[&str]) -> Self {
        self.audience = owned(orgs);
        self
    }

    pub fn managers(mut self, orgs: &[&str]) -> Self {
        self.managers = owned(orgs);
        self
    }

    /// Starts `seconds` from now (negative: already active).
    pub fn starts_in(mut self, seconds: i64) -> Self {
        self.starts_in = seconds;
        self
    }

    /// Ends `seconds` from now.
    pub fn ends_in(mut self, seconds: i64) -> Self {
        self.ends_in = Some(seconds);
        self
    }

    pub fn contract_ref(mut self, contract_ref: &str) -> Self {
        self.contract_ref = Some(contract_ref.to_owned());
        self
    }

    pub fn reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Made with the scene's key `key` instead of by the operator.
    pub fn made_by(mut self, key: &str) -> Self {
        self.made_by = Some(key.to_owned());
        self
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The request body, with its times taken from the real clock now.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "reservedUnitIds": self.units,
            "allowedOrgIds": self.audience,
            "managingOrgIds": self.managers,
            "startsAt": rfc3339_from_now(self.starts_in),
        });
        if let Some(seconds) = self.ends_in {
            body["endsAt"] = json!(rfc3339_from_now(seconds));
        }
        if let Some(contract_ref) = &self.contract_ref {
            body["contractRef"] = json!(contract_ref);
        }
        if let Some(reason) = &self.reason {
            body["reason"] = json!(reason);
        }
        body
    }

    /// Makes it with `client`; returns the request sent and the reservation made.
    #[track_caller]
    pub fn make_with(&self, client: &Client) -> (Value, Value) {
        let request = self.body();
        let response = client
            .post(&format!("/v1/nodes/{}/reservations", self.node), &request)
            .expect_status(201)
            .json();
        (request, response)
    }
}

/// Units of a scene's reservation put on the spot market, by the operator unless `by`
/// names a key, with a reason only when given one.
#[derive(Clone, Debug)]
pub struct ReleaseSpec {
    reservation: String,
    units: Vec<String>,
    by: Option<String>,
    reason: Option<String>,
}

impl ReleaseSpec {
    pub fn of(reservation: &str, units: &[&str]) -> ReleaseSpec {
        ReleaseSpec {
            reservation: reservation.to_owned(),
            units: owned(units),
            by: None,
            reason: None,
        }
    }

    pub fn by(mut self, key: &str) -> Self {
        self.by = Some(key.to_owned());
        self
    }

    pub fn reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }
}

#[derive(Clone, Debug)]
enum Step {
    Org(String),
    Node {
        id: String,
        owner: String,
        units: Vec<String>,
    },
    Key {
        name: String,
        org: String,
        role: String,
    },
    Reservation {
        name: String,
        spec: ReservationSpec,
    },
    Release(ReleaseSpec),
    Cancel(String),
    Vm {
        key: String,
        node: String,
        units: Vec<String>,
        tier: String,
    },
}

/// The fixtures to make, in order.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    steps: Vec<Step>,
}

impl Scenario {
    pub fn new() -> Scenario {
        Scenario::default()
    }

    pub fn org(mut self, id: &str) -> Self {
        self.steps.push(Step::Org(id.to_owned()));
        self
    }

    pub fn orgs(self, ids: &[&str]) -> Self {
        ids.iter().fold(self, |scenario, id| scenario.org(id))
    }

    pub fn node(mut self, id: &str, owner: &str, units: &[&str]) -> Self {
        self.steps.push(Step::Node {
            id: id.to_owned(),
            owner: owner.to_owned(),
            units: owned(units),
        });
        self
    }

    /// A key of `org` with `role`, looked up as `name`.
    pub fn key(mut self, name: &str, org: &str, role: &str) -> Self {
        self.steps.push(Step::Key {
            name: name.to_owned(),
            org: org.to_owned(),
            role: role.to_owned(),
        });
        self
    }

    /// A reservation, looked up as `name`.
    pub fn reservation(mut self, name: &str, spec: ReservationSpec) -> Self {
        self.steps.push(Step::Reservation {
            name: name.to_owned(),
            spec,
        });
        self
    }

    pub fn release(mut self, release: ReleaseSpec) -> Self {
        self.steps.push(Step::Release(release));
        self
    }

    /// Cancels the reservation `name`, as the operator.
    pub fn cancel(mut self, name: &str) -> Self {
        self.steps.push(Step::Cancel(name.to_owned()));
        self
    }

    /// A VM of `tier` placed on `units` of `node` with the scene's key `key`.
    pub fn vm(mut self, key: &str, node: &str, units: &[&str], tier: &str) -> Self {
        self.steps.push(Step::Vm {
            key: key.to_owned(),
            node: node.to_owned(),
            units: owned(units),
            tier: tier.to_owned(),
        });
        self
    }

    /// Starts an app and makes the fixtures in it.
    pub fn open(self) -> Scene {
        let app = App::start();
        let fixtures = self.make_in(&app);
        Scene { app, fixtures }
    }

    /// Makes the fixtures in a running app (several hosts may serve its state).
    pub fn make_in(self, app: &App) -> Fixtures {
        let mut made = Fixtures::default();
        for step in self.steps {
            match step {
                Step::Org(id) => app.org(&id),
                Step::Node { id, owner, units } => {
                    app.node(&id, &owner, &refs(&units));
                }
                Step::Key { name, org, role } => {
                    made.keys.insert(name, app.key(&org, &role, None));
                }
                Step::Reservation { name, spec } => {
                    let client = made.acting(app, spec.made_by.as_deref());
                    let (request, response) = spec.make_with(&client);
                    let reservation = MadeReservation {
                        node: spec.node.clone(),
                        id: response["id"].as_str().expect("id").to_owned(),
                        request,
                    };
                    made.order.push(name.clone());
                    made.reservations.insert(name, reservation);
                }
                Step::Release(release) => {
                    let client = made.acting(app, release.by.as_deref());
                    let mut body = json!({ "unitIds": release.units });
                    if let Some(reason) = &release.reason {
                        body["reason"] = json!(reason);
                    }
                    client
                        .post(
                            &format!("{}/release", made.reservation_path(&release.reservation)),
                            &body,
                        )
                        .expect_status(200);
                }
                Step::Cancel(name) => {
                    app.operator()
                        .post(
                            &format!("{}/cancel", made.reservation_path(&name)),
                            &json!({}),
                        )
                        .expect_status(200);
                }
                Step::Vm {
                    key,
                    node,
                    units,
                    tier,
                } => {
                    let vm = placed_vm(&made.client(&key), &node, &refs(&units), &tier);
                    made.vms.push(vm);
                }
            }
        }
        made
    }
}

/// A reservation the scenario made.
#[derive(Clone, Debug)]
pub struct MadeReservation {
    pub node: String,
    pub id: String,
    /// The body it was made with, times included.
    pub request: Value,
}

/// What a scenario made: its keys and reservations by name, its VMs in order.
#[derive(Clone, Default)]
pub struct Fixtures {
    keys: HashMap<String, Client>,
    reservations: HashMap<String, MadeReservation>,
    order: Vec<String>,
    vms: Vec<String>,
}

impl Fixtures {
    /// The key `name`'s client, or the operator's when no key is named.
    fn acting(&self, app: &App, name: Option<&str>) -> Client {
        name.map_or_else(|| app.operator(), |name| self.client(name))
    }

    /// The client of the key `name`.
    #[track_caller]
    pub fn client(&self, name: &str) -> Client {
        self.keys
            .get(name)
            .unwrap_or_else(|| panic!("the scene has no key {name}"))
            .clone()
    }

    /// The token of the key `name`.
    #[track_caller]
    pub fn token(&self, name: &str) -> String {
        self.client(name).token().expect("a token").to_owned()
    }

    #[track_caller]
    pub fn reservation(&self, name: &str) -> &MadeReservation {
        self.reservations
            .get(name)
            .unwrap_or_else(|| panic!("the scene has no reservation {name}"))
    }

    #[track_caller]
    pub fn reservation_id(&self, name: &str) -> String {
        self.reservation(name).id.clone()
    }

    /// `/v1/nodes/{node}/reservations/{id}` of the reservation `name`.
    #[track_caller]
    pub fn reservation_path(&self, name: &str) -> String {
        let reservation = self.reservation(name);
        format!(
            "/v1/nodes/{}/reservations/{}",
            reservation.node, reservation.id
        )
    }

    /// Every reservation made, in the order made.
    pub fn reservations(&self) -> impl Iterator<Item = &MadeReservation> {
        self.order.iter().map(|name| &self.reservations[name])
    }

    /// The ids of the VMs placed, in the order placed.
    pub fn vms(&self) -> &[String] {
        &self.vms
    }
}

/// A running app and the fixtures made in it.
pub struct Scene {
    pub app: App,
    pub fixtures: Fixtures,
}

impl Deref for Scene {
    type Target = Fixtures;

    fn deref(&self) -> &Fixtures {
        &self.fixtures
    }
}

fn owned(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

fn refs(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
}
