//! The market the workload runs in: orgs, keys, nodes and one reservation on each.

use crate::app::{App, OPERATOR_TOKEN};
use crate::scenario::{Fixtures, ReservationSpec, Scenario};

pub const NODES: [&str; 3] = ["n0", "n1", "n2"];
pub const NODE_UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];
/// The reserved units of each node's reservation; g6 and g7 stay unreserved.
pub const RESERVED_UNITS: [&str; 6] = ["g0", "g1", "g2", "g3", "g4", "g5"];
/// Added to and removed from nodes to change their topology.
pub const EXTRA_UNIT: &str = "x0";
pub const AUDIENCE: [&str; 2] = ["tenant-a", "tenant-b"];
pub const OUTSIDERS: [&str; 2] = ["outsider-a", "outsider-b"];
pub(crate) const TIERS: [&str; 3] = ["spot", "community", "verified"];

/// Who sends a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Actor {
    Operator,
    /// A capacity-manager key of the nodes' owner org.
    Owner,
    /// A capacity-manager key of the reservations' managing org.
    Broker,
    /// A viewer key of the managing org: no `reservation.capacity`.
    BrokerViewer,
    /// A member key of an audience or outsider org.
    Member(String),
}

/// Orgs, keys, three nodes and one active reservation on each, made through the API.
pub struct Market {
    pub(crate) fixtures: Fixtures,
    /// (node, reservation id)
    pub reservations: Vec<(String, String)>,
}

impl Market {
    pub fn setup(app: &App) -> Market {
        let mut scenario = Scenario::new()
            .orgs(&["owner", "broker"])
            .orgs(&AUDIENCE)
            .orgs(&OUTSIDERS)
            .key("owner", "owner", "capacity-manager")
            .key("broker", "broker", "capacity-manager")
            .key("broker-viewer", "broker", "viewer");
        for org in AUDIENCE.into_iter().chain(OUTSIDERS) {
            scenario = scenario.key(org, org, "member");
        }
        for node in NODES {
            scenario = scenario.node(node, "owner", &NODE_UNITS).reservation(
                node,
                ReservationSpec::on(node, &RESERVED_UNITS)
                    .audience(&AUDIENCE)
                    .managers(&["broker"]),
            );
        }
        let fixtures = scenario.make_in(app);
        let reservations = fixtures
            .reservations()
            .map(|r| (r.node.clone(), r.id.clone()))
            .collect();
        Market {
            fixtures,
            reservations,
        }
    }

    pub fn token(&self, actor: &Actor) -> String {
        match actor {
            Actor::Operator => OPERATOR_TOKEN.to_owned(),
            Actor::Owner => self.fixtures.token("owner"),
            Actor::Broker => self.fixtures.token("broker"),
            Actor::BrokerViewer => self.fixtures.token("broker-viewer"),
            Actor::Member(org) => self.fixtures.token(org),
        }
    }
}
