//! Routing and the `spin-*` headers, over real HTTP.

use api_support::http::*;
use api_support::probe::*;
use api_support::temp::TempDir;
use serde_json::json;
use spin_host::{Host, HostConfig};

fn echo_headers(r: &Reply) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["headers"].clone()
}

#[test]
fn headers_for_a_route_with_parameters() {
    let state = TempDir::new("headers-params");
    let host = start_probe(&state);
    let port = host.addr().port();
    let route = "/v1/nodes/:nodeId/reservations/:id/release";
    let r = post(
        format!(
            "{}/v1/nodes/n1/reservations/r1/release?x=1",
            host.base_url()
        )
        .as_str(),
        b"{}",
    );
    let h = echo_headers(&r);
    assert_eq!(
        h["spin-full-url"],
        format!("http://127.0.0.1:{port}/v1/nodes/n1/reservations/r1/release?x=1")
    );
    assert_eq!(h["spin-matched-route"], route);
    assert_eq!(h["spin-component-route"], route);
    assert_eq!(h["spin-raw-component-route"], route);
    assert_eq!(h["spin-path-info"], "");
    assert_eq!(h["spin-path-match-nodeid"], "n1");
    assert_eq!(h["spin-path-match-id"], "r1");
    assert_eq!(h["spin-base-path"], "/");
    let client = h["spin-client-addr"].as_str().unwrap();
    assert!(client.starts_with("127.0.0.1:"), "{client}");
    assert_ne!(client, format!("127.0.0.1:{port}"));
    // The client's Host header is not passed on.
    assert!(h.get("host").is_none(), "{h}");
    assert_eq!(r.json()["method"], "POST");
}

#[test]
fn headers_for_the_catch_all_wildcard() {
    let state = TempDir::new("headers-wildcard");
    let host = start_probe(&state);
    let r = get(&format!("{}/foo/bar?y=2", host.base_url()));
    let h = echo_headers(&r);
    assert_eq!(h["spin-matched-route"], "/...");
    assert_eq!(h["spin-raw-component-route"], "/...");
    assert_eq!(h["spin-component-route"], "");
    assert_eq!(h["spin-path-info"], "/foo/bar");
    assert_eq!(
        h["spin-full-url"],
        format!("http://127.0.0.1:{}/foo/bar?y=2", host.addr().port())
    );
    assert!(h.get("host").is_none());
}

#[test]
fn client_headers_pass_through_but_spin_headers_cannot_be_forged() {
    let state = TempDir::new("headers-forge");
    let host = start_probe(&state);
    let r = get_with(
        &format!("{}/anything", host.base_url()),
        &[
            ("x-custom", "yes"),
            ("spin-client-addr", "6.6.6.6:6"),
            ("authorization", "Bearer t"),
        ],
    );
    let h = echo_headers(&r);
    assert_eq!(h["x-custom"], "yes");
    assert_eq!(h["authorization"], "Bearer t");
    assert!(
        h["spin-client-addr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
}

#[test]
fn route_precedence() {
    let state = TempDir::new("precedence");
    let host = start_probe(&state);
    let base = host.base_url();
    let matched =
        |path: &str| echo_headers(&get(&format!("{base}{path}")))["spin-matched-route"].clone();
    // Exact beats parameter beats wildcard.
    assert_eq!(matched("/prec/exact"), "/prec/exact");
    assert_eq!(matched("/prec/other"), "/prec/:name");
    assert_eq!(matched("/prec/a/b"), "/prec/...");
    assert_eq!(matched("/prec"), "/prec/...");
    // A parameter, then a longer wildcard prefix.
    assert_eq!(matched("/prec/x/deep/y/z"), "/prec/:name/deep/...");
    let h = echo_headers(&get(&format!("{base}/prec/x/deep/y/z/")));
    assert_eq!(h["spin-path-match-name"], "x");
    assert_eq!(h["spin-path-info"], "/y/z/");
    assert_eq!(h["spin-component-route"], "/prec/:name/deep");
    // Everything else falls through to `/...`.
    assert_eq!(matched("/"), "/...");
    assert_eq!(
        echo_headers(&get(&format!("{base}/")))["spin-path-info"],
        "/"
    );
    // A trailing slash on an exact route still matches it.
    assert_eq!(matched("/hello/"), "/hello");
}

#[test]
fn no_route_is_spins_empty_404() {
    let dir = TempDir::new("not-found");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/only/..."
component = "c"

[[trigger.http]]
route = "/exact"
component = "c"

[component.c]
source = "{{wasm}}"
"#,
    );
    let host = Host::start(HostConfig::new(manifest)).unwrap();
    let base = host.base_url();
    // As Spin answers: 404, no body, and no header but the framing.
    for path in [
        "/",
        "/other",
        "/exact/more",
        "/onlyx",
        "/.well-known/spin/other",
    ] {
        let r = get(&format!("{base}{path}"));
        assert_eq!(r.status, 404, "{path}");
        assert!(r.body.is_empty(), "{path}: {}", r.text());
        let names: Vec<&str> = r.headers.keys().map(|n| n.as_str()).collect();
        assert!(
            names.iter().all(|n| ["content-length", "date"].contains(n)),
            "{path}: {names:?}"
        );
        assert_eq!(r.header("content-length"), Some("0"), "{path}");
    }
    assert_eq!(
        echo_headers(&get(&format!("{base}/only")))["spin-path-info"],
        ""
    );
    assert_eq!(
        echo_headers(&get(&format!("{base}/only/a")))["spin-path-info"],
        "/a"
    );
    assert_eq!(get(&format!("{base}/exact")).status, 200);
    // The state directory defaults to `.spin` beside the manifest.
    assert!(dir.path().join(".spin/sqlite_db.db").is_file());
    assert!(dir.path().join(".spin/sqlite_key_value.db").is_file());
}

#[test]
fn private_routes_are_not_reachable() {
    let dir = TempDir::new("private");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/public"
component = "public"

[[trigger.http]]
route = { private = true }
component = "internal"

[component.public]
source = "{{wasm}}"

[component.internal]
source = "{{wasm}}"
"#,
    );
    let host = Host::start(HostConfig::new(manifest)).unwrap();
    assert_eq!(get(&format!("{}/public", host.base_url())).status, 200);
    assert_eq!(get(&format!("{}/internal", host.base_url())).status, 404);
}

#[test]
fn spin_well_known_health() {
    let state = TempDir::new("health");
    let host = start_probe(&state);
    let r = get(&format!("{}/.well-known/spin/health", host.base_url()));
    assert_eq!((r.status, r.text().as_str()), (200, "OK"));
    let r = get(&format!("{}/.well-known/spin/info", host.base_url()));
    assert_eq!(r.json()["name"], json!("probe"));
}
