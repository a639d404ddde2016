//! The facts a plan reads and a write moves, each named as `fact_versions` keys it (the
//! triggers of schema/objects.sql name the same facts the same way). Every argument is an
//! SQL expression: a parameter, a column or a literal.
//!
//! A node's facts are named after the node first, so that the facts one write moves (its
//! node, units, reservations and VMs) are neighbours in `fact_versions`: one page of it
//! changes, not one per kind of fact.

/// A node: its owner, topology and units.
pub(crate) fn node(node: &str) -> String {
    format!("json_array('node', {node})")
}

/// A unit of a node: who may use it (its reservations' claims and releases, the VM on it).
pub(crate) fn unit(node: &str, unit: &str) -> String {
    format!("json_array('node', {node}, 'unit', {unit})")
}

/// A reservation on a node: its state and term.
pub(crate) fn reservation(node: &str, reservation: &str) -> String {
    format!("json_array('node', {node}, 'reservation', {reservation})")
}

/// A VM on a node: its state and deadline.
pub(crate) fn vm(node: &str, vm: &str) -> String {
    format!("json_array('node', {node}, 'vm', {vm})")
}

/// An org.
pub(crate) fn org(org: &str) -> String {
    format!("json_array('org', {org})")
}

/// An org's set of live keys, moved whenever one of them is created or revoked.
pub(crate) fn org_keys(org: &str) -> String {
    format!("json_array('org-keys', {org})")
}

/// A key (an org's or an operator's).
pub(crate) fn key(key: &str) -> String {
    format!("json_array('key', {key})")
}
