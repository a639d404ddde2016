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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fact a trigger's `json_array(…)` names, as this module names it with the same
    /// arguments; `None` for a shape it does not name.
    fn named_here(expression: &str) -> Option<String> {
        let inner = expression.strip_prefix("json_array(")?.strip_suffix(')')?;
        let arguments: Vec<&str> = inner.split(", ").collect();
        Some(match arguments.as_slice() {
            ["'node'", n] => node(n),
            ["'node'", n, "'unit'", u] => unit(n, u),
            ["'node'", n, "'reservation'", r] => reservation(n, r),
            ["'node'", n, "'vm'", v] => vm(n, v),
            ["'org'", o] => org(o),
            ["'org-keys'", o] => org_keys(o),
            ["'key'", k] => key(k),
            _ => return None,
        })
    }

    /// Every `json_array(…)` a statement of `sql` names a fact by: the values of an insert into
    /// `fact_moves`, and what a `DELETE FROM fact_versions` compares `fact` with.
    fn facts_named_in(sql: &str) -> Vec<&str> {
        let moved = sql
            .lines()
            .filter_map(|line| line.split_once("INSERT INTO fact_moves (fact) VALUES ("))
            .map(|(_, rest)| rest.trim_end().trim_end_matches(';'))
            .map(|values| values.strip_suffix(')').unwrap_or(values));
        let dropped = sql
            .lines()
            .filter_map(|line| line.split_once("DELETE FROM fact_versions WHERE fact = "))
            .map(|(_, rest)| rest.trim_end().trim_end_matches(';'));
        moved.chain(dropped).collect()
    }

    #[test]
    fn the_schema_s_triggers_name_each_fact_as_the_plans_do() {
        let named = facts_named_in(crate::schema::OBJECTS);
        assert!(
            named.len() >= 8,
            "the triggers that move or drop facts: {named:?}"
        );
        assert!(
            named.iter().any(|fact| fact.contains("'vm', NEW.id")),
            "the version an ended VM drops is among them: {named:?}"
        );
        for expression in named {
            assert_eq!(
                named_here(expression).as_deref(),
                Some(expression),
                "a trigger names a fact as facts.rs does not"
            );
        }
    }

    #[test]
    fn a_fact_named_otherwise_is_told() {
        let sql = "    DELETE FROM fact_versions WHERE fact = json_array('vm', NEW.id);\n\
                   INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.id, 'unit'));";
        for expression in facts_named_in(sql) {
            assert_eq!(named_here(expression), None, "{expression}");
        }
    }
}
