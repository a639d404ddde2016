//! The rules of docs/design.md as a second implementation: a model driven by the audit trail
//! in commit order, which decides what every answer should have been.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

use super::checks::{Verdict, sorted_strings};
use super::generate::{Kind, Record, Request};
use super::market::Actor;

/// One audit event, as stored.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) seq: i64,
    pub(crate) action: String,
    pub(crate) node_id: Option<String>,
    pub(crate) reservation_id: Option<String>,
    pub(crate) vm_id: Option<String>,
    pub(crate) org_id: Option<String>,
    pub(crate) unit_ids: Vec<String>,
    pub(crate) terminated: Vec<String>,
    pub(crate) skipped: Vec<String>,
    pub(crate) request_id: String,
}

pub(crate) fn list(text: Option<String>) -> Vec<String> {
    text.map(|t| serde_json::from_str(&t).expect("a JSON list"))
        .unwrap_or_default()
}

pub(crate) fn events(db: &rusqlite::Connection) -> Vec<Event> {
    let mut statement = db
        .prepare(
            "SELECT seq, action, node_id, reservation_id, vm_id, org_id, unit_ids, terminated, \
             skipped, coalesce(client_request_id, request_id) FROM audit_events ORDER BY seq",
        )
        .unwrap();
    statement
        .query_map([], |r| {
            Ok(Event {
                seq: r.get(0)?,
                action: r.get(1)?,
                node_id: r.get(2)?,
                reservation_id: r.get(3)?,
                vm_id: r.get(4)?,
                org_id: r.get(5)?,
                unit_ids: list(r.get(6)?),
                terminated: list(r.get(7)?),
                skipped: list(r.get(8)?),
                request_id: r.get(9)?,
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The last audit sequence number: events after it belong to the workload.
pub fn last_seq(db: &rusqlite::Connection) -> i64 {
    db.query_row("SELECT coalesce(max(seq), 0) FROM audit_events", [], |r| {
        r.get(0)
    })
    .unwrap()
}

#[derive(Debug, Clone)]
pub(crate) struct ModelReservation {
    pub(crate) node: String,
    pub(crate) units: BTreeSet<String>,
    pub(crate) released: BTreeSet<String>,
    pub(crate) state: &'static str,
    pub(crate) audience: Vec<String>,
    /// Who may see it: the node's owner, managing orgs and the audience.
    pub(crate) parties: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct ModelVm {
    pub(crate) org: String,
    pub(crate) node: String,
    pub(crate) units: Vec<String>,
    pub(crate) tier: String,
    pub(crate) running: bool,
    pub(crate) reclaimed: bool,
}

/// The rules of docs/design.md as a model, driven by the audit trail in commit order.
#[derive(Default)]
pub(crate) struct Model {
    pub(crate) nodes: BTreeMap<String, BTreeSet<String>>,
    pub(crate) reservations: BTreeMap<String, ModelReservation>,
    pub(crate) vms: BTreeMap<String, ModelVm>,
    /// The running VMs on each (node, unit), an index over `vms`.
    pub(crate) running: BTreeMap<(String, String), BTreeSet<String>>,
    /// Released set right after each release/reclaim event, by request id.
    pub(crate) released_after: HashMap<String, BTreeSet<String>>,
}

impl Model {
    /// The running VMs on any of `units` of `node`, each once, by id.
    pub(crate) fn running_on<'a>(
        &'a self,
        node: &'a str,
        units: &'a [String],
    ) -> impl Iterator<Item = (&'a String, &'a ModelVm)> + 'a {
        let ids: BTreeSet<&String> = units
            .iter()
            .filter_map(|u| self.running.get(&(node.to_owned(), u.clone())))
            .flatten()
            .collect();
        ids.into_iter().map(|id| (id, &self.vms[id]))
    }

    pub(crate) fn set_running(&mut self, id: &str, running: bool) {
        let Some(vm) = self.vms.get_mut(id) else {
            return;
        };
        vm.running = running;
        for unit in &vm.units {
            let on_unit = self
                .running
                .entry((vm.node.clone(), unit.clone()))
                .or_default();
            if running {
                on_unit.insert(id.to_owned());
            } else {
                on_unit.remove(id);
            }
        }
    }

    pub(crate) fn holders<'a>(
        &'a self,
        node: &'a str,
        unit: &'a str,
    ) -> impl Iterator<Item = &'a ModelReservation> + 'a {
        self.reservations
            .values()
            .filter(move |r| r.state != "cancelled" && r.node == node && r.units.contains(unit))
    }
}

/// Replays the audit trail, checking at each event that the rules held at that instant, and
/// returns the model of the final state. `observe` sees the model before the first event (as
/// after event 0) and after each event.
pub(crate) fn replay(
    db: &rusqlite::Connection,
    events: &[Event],
    verdict: &mut Verdict,
    mut observe: impl FnMut(&Model, i64),
) -> Model {
    let audiences = audiences(db);
    let tiers = tiers(db);
    let mut model = Model::default();
    // The state before the first event: a cell no request changed (a VM id that names a cell
    // without nodes, say) has no other.
    observe(&model, 0);
    for event in events {
        let at = format!(
            "event {} ({}, {})",
            event.seq, event.action, event.request_id
        );
        match event.action.as_str() {
            "node.create" => model.create_node(event),
            "node.update" => model.update_node(event, &at, verdict),
            "reservation.create" => model.create_reservation(event, &audiences),
            "reservation.reaffirm" => model.reaffirm(event, &at, verdict),
            "reservation.cancel" => model.cancel(event),
            "reservation.release" => model.release(event, &at, verdict),
            "reservation.reclaim" => model.reclaim(event, &at, verdict),
            "vm.place" => model.place_vm(event, &at, &tiers, verdict),
            "vm.terminate" => model.terminate_vm(event, &at, verdict),
            _ => {}
        }
        observe(&model, event.seq);
    }
    model
}

/// Each reservation's audience and parties (the managing orgs, the node's owner and the
/// audience), by id.
fn audiences(db: &rusqlite::Connection) -> HashMap<String, (Vec<String>, Vec<String>)> {
    db.prepare(
        "SELECT r.id, r.allowed_org_ids, r.managing_org_ids, n.owner_org_id \
             FROM reservations r JOIN nodes n ON n.id = r.node_id",
    )
    .unwrap()
    .query_map([], |r| {
        let audience = list(r.get(1)?);
        let mut parties = list(r.get(2)?);
        parties.push(r.get(3)?);
        parties.extend(audience.iter().cloned());
        Ok((r.get(0)?, (audience, parties)))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Each VM's tier, by id.
fn tiers(db: &rusqlite::Connection) -> HashMap<String, String> {
    db.prepare("SELECT id, tier FROM vms")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The model's step for each kind of audit event, checking that the rules held at it.
impl Model {
    /// A node and its units.
    fn create_node(&mut self, event: &Event) {
        let node = event.node_id.clone().unwrap_or_default();
        self.nodes
            .insert(node, event.unit_ids.iter().cloned().collect());
    }

    /// A topology change: withholds the live reservations of a changed node, and may not
    /// remove units under running VMs.
    fn update_node(&mut self, event: &Event, at: &str, verdict: &mut Verdict) {
        let node = event.node_id.clone().unwrap_or_default();
        let new_units: BTreeSet<String> = event.unit_ids.iter().cloned().collect();
        let changed = self.nodes.get(&node) != Some(&new_units);
        let expected_withheld: Vec<String> = if changed {
            self.reservations
                .iter()
                .filter(|(_, r)| r.node == node && r.state == "live")
                .map(|(id, _)| id.clone())
                .collect()
        } else {
            Vec::new()
        };
        verdict.check(event.skipped == expected_withheld, || {
            format!(
                "{at}: withheld {:?}, the rule says {expected_withheld:?}",
                event.skipped
            )
        });
        let removed: Vec<String> = self.nodes[&node].difference(&new_units).cloned().collect();
        let busy: Vec<&String> = self.running_on(&node, &removed).map(|(id, _)| id).collect();
        verdict.check(busy.is_empty(), || {
            format!("{at}: removed units {removed:?} while VMs {busy:?} ran on them")
        });
        for id in &expected_withheld {
            self.reservations.get_mut(id).unwrap().state = "needs-review";
        }
        self.nodes.insert(node, new_units);
    }

    /// A reservation, live, with the parties the database names.
    fn create_reservation(
        &mut self,
        event: &Event,
        audiences: &HashMap<String, (Vec<String>, Vec<String>)>,
    ) {
        let node = event.node_id.clone().unwrap_or_default();
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        self.reservations.insert(
            reservation_id.clone(),
            ModelReservation {
                node,
                units: event.unit_ids.iter().cloned().collect(),
                released: BTreeSet::new(),
                state: "live",
                audience: audiences
                    .get(&reservation_id)
                    .map(|(audience, _)| audience.clone())
                    .unwrap_or_default(),
                parties: audiences
                    .get(&reservation_id)
                    .map(|(_, parties)| parties.clone())
                    .unwrap_or_default(),
            },
        );
    }

    /// Only a reservation under review is re-affirmed, with units all on the node.
    fn reaffirm(&mut self, event: &Event, at: &str, verdict: &mut Verdict) {
        let node = event.node_id.clone().unwrap_or_default();
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        let node_units = self.nodes[&node].clone();
        let r = self.reservations.get_mut(&reservation_id).unwrap();
        verdict.check(r.state == "needs-review", || {
            format!("{at}: re-affirmed a reservation in state {}", r.state)
        });
        r.units = event.unit_ids.iter().cloned().collect();
        verdict.check(r.units.is_subset(&node_units), || {
            format!("{at}: re-affirmed units {:?} not all on the node", r.units)
        });
        r.released = r.released.intersection(&r.units).cloned().collect();
        r.state = "live";
    }

    /// A reservation cancelled.
    fn cancel(&mut self, event: &Event) {
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        self.reservations.get_mut(&reservation_id).unwrap().state = "cancelled";
    }

    /// Only units of a live reservation, and none under a non-spot VM, are released.
    fn release(&mut self, event: &Event, at: &str, verdict: &mut Verdict) {
        let node = event.node_id.clone().unwrap_or_default();
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        let non_spot: Vec<String> = self
            .running_on(&node, &event.unit_ids)
            .filter(|(_, vm)| vm.tier != "spot")
            .map(|(id, _)| id.clone())
            .collect();
        verdict.check(non_spot.is_empty(), || {
            format!("{at}: released units under non-spot VMs {non_spot:?}")
        });
        let r = self.reservations.get_mut(&reservation_id).unwrap();
        verdict.check(r.state == "live", || {
            format!("{at}: released units of a reservation in state {}", r.state)
        });
        verdict.check(event.unit_ids.iter().all(|u| r.units.contains(u)), || {
            format!("{at}: released units outside the reservation")
        });
        r.released.extend(event.unit_ids.iter().cloned());
        self.released_after
            .insert(event.request_id.clone(), r.released.clone());
    }

    /// A reclaim terminates exactly the spot VMs on its units and skips the others.
    fn reclaim(&mut self, event: &Event, at: &str, verdict: &mut Verdict) {
        let node = event.node_id.clone().unwrap_or_default();
        let reservation_id = event.reservation_id.clone().unwrap_or_default();
        let (mut spot, mut other): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
        for (id, vm) in self.running_on(&node, &event.unit_ids) {
            if vm.tier == "spot" {
                spot.push(id.clone());
            } else {
                other.push(id.clone());
            }
        }
        verdict.check(event.terminated == spot, || {
            format!(
                "{at}: terminated {:?}, the spot VMs on those units were {spot:?}",
                event.terminated
            )
        });
        verdict.check(event.skipped == other, || {
            format!(
                "{at}: skipped {:?}, the non-spot VMs on those units were {other:?}",
                event.skipped
            )
        });
        for id in &event.terminated {
            if let Some(vm) = self.vms.get_mut(id) {
                vm.reclaimed = true;
            }
            self.set_running(id, false);
        }
        let r = self.reservations.get_mut(&reservation_id).unwrap();
        verdict.check(r.state == "live", || {
            format!(
                "{at}: reclaimed units of a reservation in state {}",
                r.state
            )
        });
        for unit in &event.unit_ids {
            r.released.remove(unit);
        }
        self.released_after
            .insert(event.request_id.clone(), r.released.clone());
    }

    /// A VM placed only on free units of its node that its org may use at its tier.
    fn place_vm(
        &mut self,
        event: &Event,
        at: &str,
        tiers: &HashMap<String, String>,
        verdict: &mut Verdict,
    ) {
        let node = event.node_id.clone().unwrap_or_default();
        let vm_id = event.vm_id.clone().unwrap_or_default();
        let org = event.org_id.clone().unwrap_or_default();
        let tier = tiers.get(&vm_id).cloned().unwrap_or_default();
        verdict.check(!self.vms.contains_key(&vm_id), || {
            format!("{at}: VM {vm_id} placed twice")
        });
        for unit in &event.unit_ids {
            verdict.check(
                self.nodes.get(&node).is_some_and(|u| u.contains(unit)),
                || format!("{at}: placed on {unit}, not a unit of {node}"),
            );
            let busy: Vec<&String> = self
                .running_on(&node, std::slice::from_ref(unit))
                .map(|(id, _)| id)
                .collect();
            verdict.check(busy.is_empty(), || {
                format!("{at}: placed on {unit}, which ran {busy:?}")
            });
            for holder in self.holders(&node, unit) {
                verdict.check(holder.state != "needs-review", || {
                    format!("{at}: placed on {unit} of a needs-review reservation")
                });
                if holder.state == "live" && holder.released.contains(unit) {
                    verdict.check(tier == "spot", || {
                        format!("{at}: {tier} VM placed on released unit {unit}")
                    });
                } else if holder.state == "live" {
                    verdict.check(holder.audience.contains(&org), || {
                        format!(
                            "{at}: {org} placed on {unit} reserved for {:?}",
                            holder.audience
                        )
                    });
                }
            }
        }
        self.vms.insert(
            vm_id.clone(),
            ModelVm {
                org,
                node,
                units: event.unit_ids.clone(),
                tier,
                running: false,
                reclaimed: false,
            },
        );
        self.set_running(&vm_id, true);
    }

    /// Only a running VM is terminated.
    fn terminate_vm(&mut self, event: &Event, at: &str, verdict: &mut Verdict) {
        let vm_id = event.vm_id.clone().unwrap_or_default();
        let vm = self.vms.get_mut(&vm_id);
        verdict.check(vm.as_ref().is_some_and(|vm| vm.running), || {
            format!("{at}: terminated {vm_id}, which was not running")
        });
        if vm.is_some() {
            self.set_running(&vm_id, false);
        }
    }
}

pub(crate) fn problem(status: u16, code: &str) -> Value {
    json!({ "status": status, "code": code })
}

pub(crate) fn sorted_list<T: AsRef<str>>(items: impl IntoIterator<Item = T>) -> Value {
    let set: BTreeSet<String> = items.into_iter().map(|i| i.as_ref().to_owned()).collect();
    json!(set)
}

/// The parts of an answer the model decides: the status, and for a refusal its code and the
/// ids it names; for a dry run what it would terminate and skip.
pub(crate) fn observed(record: &Record) -> Value {
    let body = record.json();
    if (200..300).contains(&record.status) {
        let mut outcome = json!({ "status": record.status });
        if record.kind == Kind::DryRun {
            for member in ["wouldTerminate", "wouldSkip"] {
                outcome[member] = sorted_strings(&body[member]).map_or(Value::Null, |l| json!(l));
            }
        }
        return outcome;
    }
    let code = body["code"].as_str().unwrap_or_default();
    let mut outcome = problem(record.status, code);
    let sorted = |member: &str| sorted_strings(&body[member]).map_or(Value::Null, |l| json!(l));
    match code {
        "units-not-in-reservation" | "units-in-use" => outcome["unitIds"] = sorted("unitIds"),
        "units-not-idle" => {
            outcome["unitIds"] = sorted("unitIds");
            outcome["vmIds"] = sorted("vmIds");
        }
        "reservation-not-active" | "reservation-not-needs-review" => {
            outcome["reservationStatus"] = body["reservationStatus"].clone();
        }
        "placement-refused" => outcome["refusals"] = body["refusals"].clone(),
        _ => {}
    }
    outcome
}

pub(crate) fn status_of(reservation: &ModelReservation) -> &'static str {
    match reservation.state {
        "live" => "active",
        other => other,
    }
}

/// The strings of a JSON array, in order (anything else in it, or no array, is left out: the
/// model answers whatever the request's body was).
pub(crate) fn string_items(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Model {
    /// What the service must answer to `request` (not a replay) in this state.
    pub(crate) fn answer(&self, kind: Kind, request: &Request) -> Value {
        let body: Value = request.body.as_deref().map_or(Value::Null, |b| {
            serde_json::from_str(b).unwrap_or(Value::Null)
        });
        let units: Vec<String> = string_items(&body["unitIds"]);
        let segments: Vec<&str> = request.path.split('/').collect();
        match kind {
            Kind::CapacityWithoutPermission => problem(404, "not-found"),
            Kind::Release | Kind::Reclaim | Kind::DryRun => {
                // /v1/nodes/{node}/reservations/{id}/{action}
                let (node, id) = (segments[3], segments[5]);
                let Some(r) = self.reservations.get(id) else {
                    return problem(404, "not-found");
                };
                let strangers: Vec<&String> =
                    units.iter().filter(|u| !r.units.contains(*u)).collect();
                if !strangers.is_empty() {
                    let mut p = problem(422, "units-not-in-reservation");
                    p["unitIds"] = sorted_list(strangers);
                    return p;
                }
                if r.state != "live" {
                    let mut p = problem(409, "reservation-not-active");
                    p["reservationStatus"] = json!(status_of(r));
                    return p;
                }
                let (spot, other): (Vec<_>, Vec<_>) = self
                    .running_on(node, &units)
                    .partition(|(_, vm)| vm.tier == "spot");
                match kind {
                    Kind::Release if !other.is_empty() => {
                        let mut p = problem(409, "units-not-idle");
                        p["unitIds"] = sorted_list(
                            other
                                .iter()
                                .flat_map(|(_, vm)| vm.units.iter().filter(|u| units.contains(u))),
                        );
                        p["vmIds"] = sorted_list(other.iter().map(|(id, _)| id));
                        p
                    }
                    Kind::DryRun => json!({
                        "status": 200,
                        "wouldTerminate": sorted_list(spot.iter().map(|(id, _)| id)),
                        "wouldSkip": sorted_list(other.iter().map(|(id, _)| id)),
                    }),
                    _ => json!({ "status": 200 }),
                }
            }
            Kind::Place => {
                let Actor::Member(org) = &request.actor else {
                    return problem(403, "forbidden");
                };
                let node = body["nodeId"].as_str().unwrap_or_default();
                let tier = body["tier"].as_str().unwrap_or_default();
                let Some(node_units) = self.nodes.get(node) else {
                    return problem(404, "not-found");
                };
                let refusals: Vec<Value> = units
                    .iter()
                    .filter_map(|unit| {
                        self.refusal(org, tier, node, node_units, unit)
                            .map(|reason| json!({ "unitId": unit, "reason": reason }))
                    })
                    .collect();
                if refusals.is_empty() {
                    json!({ "status": 201 })
                } else {
                    let mut p = problem(409, "placement-refused");
                    p["refusals"] = json!(refusals);
                    p
                }
            }
            Kind::Terminate => {
                let id = request.path.trim_start_matches("/v1/vms/");
                let Some(vm) = self.vms.get(id) else {
                    return problem(404, "not-found");
                };
                let manages = vm.units.iter().any(|unit| {
                    self.holders(&vm.node, unit)
                        .any(|r| r.state == "live" && r.units.contains(unit))
                });
                let allowed = match &request.actor {
                    Actor::Operator => true,
                    Actor::Member(org) if *org == vm.org => true,
                    Actor::Owner | Actor::Broker if manages && vm.tier == "spot" => true,
                    Actor::Owner | Actor::Broker if manages => return problem(403, "forbidden"),
                    _ => return problem(404, "not-found"),
                };
                if allowed && !vm.running {
                    problem(409, "vm-terminated")
                } else {
                    json!({ "status": 200 })
                }
            }
            Kind::PutNode => {
                let node = segments[3];
                let new_units: BTreeSet<String> =
                    string_items(&body["unitIds"]).into_iter().collect();
                let removed: Vec<String> = self
                    .nodes
                    .get(node)
                    .map(|units| units.difference(&new_units).cloned().collect())
                    .unwrap_or_default();
                let busy: Vec<&String> = removed
                    .iter()
                    .filter(|u| {
                        self.running
                            .get(&(node.to_owned(), (*u).clone()))
                            .is_some_and(|ids| !ids.is_empty())
                    })
                    .collect();
                if busy.is_empty() {
                    json!({ "status": 200 })
                } else {
                    let mut p = problem(409, "units-in-use");
                    p["unitIds"] = sorted_list(busy);
                    p
                }
            }
            Kind::Reaffirm => {
                let Some(r) = self.reservations.get(segments[5]) else {
                    return problem(404, "not-found");
                };
                if r.state == "needs-review" {
                    json!({ "status": 200 })
                } else {
                    let mut p = problem(409, "reservation-not-needs-review");
                    p["reservationStatus"] = json!(status_of(r));
                    p
                }
            }
            Kind::Replay | Kind::Duplicate => Value::Null,
        }
    }

    /// Why `org` may not place a `tier` VM on `unit` of `node`, as the placement rules
    /// (docs/design.md, "Placement") say (the reservations here are all inside their term).
    pub(crate) fn refusal(
        &self,
        org: &str,
        tier: &str,
        node: &str,
        node_units: &BTreeSet<String>,
        unit: &str,
    ) -> Option<&'static str> {
        if !node_units.contains(unit) {
            return Some("unknown-unit");
        }
        if self
            .running
            .get(&(node.to_owned(), unit.to_owned()))
            .is_some_and(|ids| !ids.is_empty())
        {
            return Some("unit-busy");
        }
        let holders: Vec<&ModelReservation> = self.holders(node, unit).collect();
        // A refusal caused by a reservation says why only to its parties.
        let because_of = |r: &ModelReservation, reason| {
            Some(if r.parties.iter().any(|o| o == org) {
                reason
            } else {
                "unavailable"
            })
        };
        if let Some(withheld) = holders.iter().find(|r| r.state == "needs-review") {
            return because_of(withheld, "withheld-needs-review");
        }
        if let Some(active) = holders.iter().find(|r| r.state == "live") {
            if active.released.contains(unit) {
                return (tier != "spot").then_some("released-spot-only");
            }
            if active.audience.iter().any(|o| o == org) {
                return None;
            }
            return because_of(active, "reserved-for-audience");
        }
        None
    }
}
