//! The app's routes, read from the one route table (`reservations_http::routes`), and the
//! check that spin.toml sends each component exactly the routes the table gives it.

use std::collections::{BTreeMap, BTreeSet};

use reservations_http::routes::{Kind, ROUTES};
use spin_host::manifest::Manifest;

use api_support::workspace;

/// `(METHOD, route)` pairs the app serves, routes in spin.toml's syntax.
pub fn served_routes() -> BTreeSet<(String, String)> {
    ROUTES
        .iter()
        .map(|r| (r.method.as_str().to_owned(), r.pattern.to_owned()))
        .collect()
}

/// The JSON API's `(METHOD, route)` pairs: what the OpenAPI document describes. The other
/// routes are the console's page and assets, covered by the authorization sweep and, in a
/// browser, by `scripts/console-test`.
pub fn api_routes() -> BTreeSet<(String, String)> {
    ROUTES
        .iter()
        .filter(|r| r.kind != Kind::ConsoleFile)
        .map(|r| (r.method.as_str().to_owned(), r.pattern.to_owned()))
        .collect()
}

/// The `(METHOD, route)` pairs of the JSON API that need no authentication.
pub fn public_api_routes() -> BTreeSet<(String, String)> {
    ROUTES
        .iter()
        .filter(|r| r.kind == Kind::Public)
        .map(|r| (r.method.as_str().to_owned(), r.pattern.to_owned()))
        .collect()
}

#[test]
fn spin_toml_sends_each_component_the_routes_of_the_table() {
    let manifest = Manifest::load(&workspace().join("spin.toml")).expect("spin.toml");
    let mut in_manifest: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for trigger in &manifest.http_triggers {
        let route = trigger.route.as_deref().expect("no private routes");
        in_manifest
            .entry(trigger.component.as_str())
            .or_default()
            .insert(route);
    }
    let mut in_table: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for route in ROUTES {
        in_table
            .entry(route.component)
            .or_default()
            .insert(route.pattern);
    }
    assert_eq!(
        in_manifest, in_table,
        "spin.toml's routes (left), the table's (right)"
    );
}

#[test]
fn only_the_console_serves_outside_the_api() {
    for route in ROUTES {
        assert_eq!(
            route.pattern.starts_with("/v1/"),
            route.kind != Kind::ConsoleFile,
            "{} {} of {}",
            route.method.as_str(),
            route.pattern,
            route.component
        );
    }
}
