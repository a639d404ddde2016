//! The README's quick start runs: `scripts/demo` (the same steps, with curl and jq) against
//! the served app must finish without one unexpected status. And the README's route table
//! says exactly what the app serves.

use std::collections::BTreeSet;
use std::process::Command;

use crate::routes::served_routes;
use api_support::{App, OPERATOR_TOKEN, workspace};

#[test]
fn the_quick_start_runs_end_to_end_against_the_served_app() {
    let jq = Command::new("jq").arg("--version").output();
    assert!(
        jq.is_ok_and(|o| o.status.success()),
        "scripts/demo needs jq (scripts/test installs it: apt-get install -y jq)"
    );
    let app = App::start();
    let output = Command::new("bash")
        .arg(workspace().join("scripts/demo"))
        .env("BASE", &app.base)
        .env("OP", OPERATOR_TOKEN)
        .output()
        .expect("run scripts/demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("the whole journey worked"), "{stdout}");
}

/// The `(METHOD, route)` pairs of the README's route table ("The API in one screen"), routes
/// written `/v1/nodes/{nodeId}` and turned into spin.toml's `/v1/nodes/:nodeId`.
fn readme_routes() -> BTreeSet<(String, String)> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## The API in one screen")
        .nth(1)
        .expect("the README has a route table");
    let mut routes = BTreeSet::new();
    for line in section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let route = cells[1].trim_matches('`');
        let route = route
            .split('/')
            .map(|segment| match segment.strip_prefix('{') {
                Some(name) => format!(":{}", name.trim_end_matches('}')),
                None => segment.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("/");
        // `GET, PUT (a note)`: the methods come before any parenthesised note.
        let methods = cells[2].split('(').next().unwrap_or_default();
        for method in methods.split(',') {
            routes.insert((method.trim().to_owned(), route.clone()));
        }
    }
    routes
}

#[test]
fn the_readme_route_table_is_what_the_app_serves() {
    let documented = readme_routes();
    let served = served_routes();
    let not_served: Vec<_> = documented.difference(&served).collect();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(
        not_served.is_empty() && undocumented.is_empty(),
        "README rows the app does not serve: {not_served:?}\nserved routes the README leaves out: {undocumented:?}"
    );
}
