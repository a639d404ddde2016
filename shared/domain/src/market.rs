//! The spot market: which units anyone may buy right now (at tier=spot only), and what a
//! buyer learns about them.
//!
//! A unit is **for sale** when a reservation whose status is `active` has released it, no
//! VM runs on it, and no `needs-review` reservation withholds it: exactly the units on
//! which placement would accept a spot VM from an org outside the audience because of a
//! release. Units of pending, needs-review, cancelled or expired reservations are not for
//! sale (the release belongs to a term that is not running).
//!
//! A listing says only "this unit of this node is for sale until `endsAt`": never the
//! reservation's id, audience, managers, contract or reason, which the buyer may not see.

use crate::access::{Caller, Decision, Permission};
use crate::reservation::{Status, Term};
use crate::{NodeId, Timestamp, UnitId};

/// The largest page of a market listing.
pub const MAX_PAGE: usize = 1000;
/// The page size when the caller does not ask for one.
pub const DEFAULT_PAGE: usize = 100;

/// What the store knows about a released unit, as a market candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedUnit {
    pub node_id: NodeId,
    pub unit_id: UnitId,
    /// The status of the reservation that released it.
    pub status: Status,
    pub term: Term,
    /// The end of a timed release (`until`), if the release has one.
    pub released_until: Option<Timestamp>,
    pub running_vm: bool,
    /// Whether a `needs-review` reservation also claims the unit.
    pub withheld: bool,
}

/// One unit for sale, as every key with `node.read` may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub node_id: NodeId,
    pub unit_id: UnitId,
    /// The end of the releasing reservation's term; `None` when it is open-ended.
    pub until: Option<Timestamp>,
}

/// Whether a released unit is for sale.
pub fn is_for_sale(unit: &ReleasedUnit) -> bool {
    unit.status == Status::Active && !unit.running_vm && !unit.withheld
}

/// The offer a released unit makes, if it is for sale: only the node, the unit and when it
/// stops being for sale (the release's `until`, or else the term's end).
pub fn offer(unit: &ReleasedUnit) -> Option<Offer> {
    is_for_sale(unit).then(|| Offer {
        node_id: unit.node_id.clone(),
        unit_id: unit.unit_id.clone(),
        until: match (unit.released_until, unit.term.ends_at) {
            (Some(until), Some(end)) => Some(until.min(end)),
            (until, end) => until.or(end),
        },
    })
}

/// Read the market: every key with `node.read` (the market is public to buyers; what it
/// shows is what the node listing already shows, plus which units are for sale until when).
pub fn may_read_market(caller: &Caller) -> Decision {
    if caller.has(Permission::NodeRead) {
        Decision::Allow
    } else {
        Decision::Forbidden
    }
}

/// The listing's cursor: the last offer of the previous page, `<nodeId>/<unitId>` (ids never
/// contain `/`).
pub fn cursor_of(node_id: &str, unit_id: &str) -> String {
    format!("{node_id}/{unit_id}")
}

/// Parses a cursor made by [`cursor_of`]; `None` when it is not one.
pub fn parse_cursor(cursor: &str) -> Option<(&str, &str)> {
    let (node, unit) = cursor.split_once('/')?;
    (crate::ids::is_valid_id(node) && crate::ids::is_valid_id(unit)).then_some((node, unit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Role;
    use crate::time::from_millis;

    fn unit(status: Status, running_vm: bool, withheld: bool) -> ReleasedUnit {
        ReleasedUnit {
            node_id: "n1".into(),
            unit_id: "u1".into(),
            status,
            term: Term {
                starts_at: from_millis(0),
                ends_at: Some(from_millis(1_000)),
            },
            released_until: None,
            running_vm,
            withheld,
        }
    }

    #[test]
    fn only_idle_units_of_active_reservations_are_for_sale() {
        for status in Status::ALL {
            for running_vm in [false, true] {
                for withheld in [false, true] {
                    let expected = status == Status::Active && !running_vm && !withheld;
                    assert_eq!(
                        is_for_sale(&unit(status, running_vm, withheld)),
                        expected,
                        "{status:?} running={running_vm} withheld={withheld}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_offer_says_node_unit_and_term_end_only() {
        let offer = offer(&unit(Status::Active, false, false)).expect("for sale");
        assert_eq!(
            offer,
            Offer {
                node_id: "n1".into(),
                unit_id: "u1".into(),
                until: Some(from_millis(1_000)),
            }
        );
        let mut open = unit(Status::Active, false, false);
        open.term.ends_at = None;
        assert_eq!(super::offer(&open).expect("for sale").until, None);
        assert_eq!(super::offer(&unit(Status::Pending, false, false)), None);
    }

    #[test]
    fn every_role_may_read_the_market_and_a_key_without_node_read_may_not() {
        for role in Role::ALL {
            let caller = Caller {
                key_id: "k".into(),
                org_id: Some("o".into()),
                permissions: role.permissions(),
            };
            assert_eq!(may_read_market(&caller), Decision::Allow, "{role:?}");
        }
        assert_eq!(may_read_market(&Caller::operator("op")), Decision::Allow);
        let narrow = Caller {
            key_id: "k".into(),
            org_id: Some("o".into()),
            permissions: [Permission::AuditRead].into_iter().collect(),
        };
        assert_eq!(may_read_market(&narrow), Decision::Forbidden);
    }

    /// For sale means: an outsider's spot VM would be placed there, and it is there because
    /// an active reservation released it. Checked against placement over every combination
    /// of the releasing claim's status, a second claim, and a running VM.
    #[test]
    fn for_sale_agrees_with_placement_for_an_outsider_at_tier_spot() {
        use crate::placement::{UnitClaim, UnitFacts, refusal_for_unit};
        use crate::vm::Tier;
        let claim = |status, released| UnitClaim {
            reservation_id: "r".into(),
            status,
            released,
            allowed_org_ids: vec!["aud".into()],
            party_org_ids: vec!["owner".into(), "aud".into()],
        };
        for status in Status::ALL {
            for other in [
                None,
                Some(Status::Pending),
                Some(Status::NeedsReview),
                Some(Status::Expired),
            ] {
                for running_vm in [false, true] {
                    let mut claims = vec![claim(status, true)];
                    claims.extend(other.map(|s| claim(s, false)));
                    let facts = UnitFacts {
                        unit_id: "u1".into(),
                        on_node: true,
                        running_vm: running_vm.then(|| "vm".to_owned()),
                        claims: claims.clone(),
                    };
                    let released = ReleasedUnit {
                        node_id: "n1".into(),
                        unit_id: "u1".into(),
                        status,
                        term: Term {
                            starts_at: from_millis(0),
                            ends_at: None,
                        },
                        released_until: None,
                        running_vm,
                        withheld: claims.iter().any(|c| c.status == Status::NeedsReview),
                    };
                    let placeable = refusal_for_unit("outsider", Tier::Spot, &facts).is_none();
                    assert_eq!(
                        is_for_sale(&released),
                        placeable && status == Status::Active,
                        "{status:?} other={other:?} running={running_vm}"
                    );
                }
            }
        }
    }

    #[test]
    fn cursors_round_trip_and_junk_is_refused() {
        assert_eq!(parse_cursor(&cursor_of("n:1", "u-2")), Some(("n:1", "u-2")));
        for junk in ["", "n1", "/u1", "n1/", "n 1/u1", "n1/u1/x"] {
            assert_eq!(parse_cursor(junk), None, "{junk:?}");
        }
    }
}
