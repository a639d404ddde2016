//! Start-up: errors that stop the host, the compile caches, and the binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use api_support::http::*;
use api_support::probe::*;
use api_support::temp::TempDir;
use spin_host::{Host, HostConfig, LoadSource};

fn start_error(config: HostConfig) -> String {
    match Host::start(config) {
        Ok(_) => panic!("the host should refuse to start"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn required_variable_missing_refuses_to_start() {
    let state = TempDir::new("required");
    probe_wasm();
    let e = start_error(HostConfig::new(probe_manifest()).state_dir(state.path()));
    assert!(e.contains("`api_token`"), "{e}");
    assert!(e.contains("SPIN_VARIABLE_API_TOKEN"), "{e}");
    assert!(e.contains("required"), "{e}");
}

#[test]
fn missing_wasm_names_the_path_and_the_build_command() {
    let dir = TempDir::new("missing-wasm");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/..."
component = "gone"

[component.gone]
source = "target/wasm32-wasip2/release/gone.wasm"
"#,
    );
    let e = start_error(HostConfig::new(manifest));
    assert!(e.contains("gone.wasm does not exist"), "{e}");
    assert!(
        e.contains("cargo build --target wasm32-wasip2 --release"),
        "{e}"
    );

    // With a build command in the manifest, that command is suggested.
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/..."
component = "gone"

[component.gone]
source = "gone.wasm"
[component.gone.build]
command = "cargo build --target wasm32-wasip2 --release -p fn-gone"
"#,
    );
    let e = start_error(HostConfig::new(manifest));
    assert!(e.contains("-p fn-gone"), "{e}");
}

#[test]
fn route_to_unknown_component_refuses_to_start() {
    let dir = TempDir::new("unknown-component");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/x"
component = "nobody"

[component.somebody]
source = "{{wasm}}"
"#,
    );
    let e = start_error(HostConfig::new(manifest));
    assert!(e.contains("trigger.http[0].component"), "{e}");
    assert!(e.contains("`nobody`"), "{e}");
}

#[test]
fn bad_manifest_names_the_key() {
    let dir = TempDir::new("bad-manifest");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/x"
component = "c"

[component.c]
source = "{{wasm}}"
sqlite_database = ["default"]
"#,
    );
    let e = start_error(HostConfig::new(manifest));
    assert!(
        e.contains("`component.c.sqlite_database`: unknown key"),
        "{e}"
    );
    let e = start_error(HostConfig::new(dir.path().join("does-not-exist.toml")));
    assert!(e.contains("cannot read the manifest"), "{e}");
}

#[test]
fn undefined_store_or_database_label_refuses_to_start() {
    let dir = TempDir::new("labels");
    for (field, what) in [
        ("key_value_stores", "key-value store"),
        ("sqlite_databases", "SQLite database"),
    ] {
        let manifest = write_manifest(
            &dir,
            &format!(
                r#"
[[trigger.http]]
route = "/x"
component = "c"

[component.c]
source = "{{{{wasm}}}}"
{field} = ["default", "analytics"]
"#
            ),
        );
        let e = start_error(HostConfig::new(manifest));
        assert!(e.contains(what) && e.contains("\"analytics\""), "{e}");
    }
}

#[test]
fn a_port_in_use_is_an_error() {
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let state = TempDir::new("port");
    let e = start_error(probe_config(&state).listen(blocker.local_addr().unwrap()));
    assert!(e.contains("cannot listen on"), "{e}");
}

#[test]
fn components_compile_once_per_process() {
    let a = TempDir::new("cache-a");
    let b = TempDir::new("cache-b");
    let first = start_probe(&a);
    let second = start_probe(&b);
    // Both components use the same .wasm: only one load can be a real one.
    let all: Vec<LoadSource> = first
        .component_loads()
        .iter()
        .chain(second.component_loads())
        .map(|l| l.source)
        .collect();
    assert_eq!(all.len(), 4);
    assert!(
        all.iter().filter(|s| **s != LoadSource::Memory).count() <= 1,
        "{all:?}"
    );
    assert!(
        second
            .component_loads()
            .iter()
            .all(|l| l.source == LoadSource::Memory)
    );
    for load in first
        .component_loads()
        .iter()
        .chain(second.component_loads())
    {
        eprintln!("{} {:?} in {:?}", load.component, load.source, load.elapsed);
    }
    assert_eq!(get(&format!("{}/hello", second.base_url())).text(), "hello");
    first.shutdown();
    // The other host is unaffected.
    assert_eq!(get(&format!("{}/hello", second.base_url())).text(), "hello");
}

#[test]
fn shutdown_frees_the_port() {
    let state = TempDir::new("shutdown");
    let host = start_probe(&state);
    let addr = host.addr();
    host.shutdown();
    std::net::TcpListener::bind(addr).expect("port is free after shutdown");
}

const BIN: &str = env!("CARGO_BIN_EXE_spin-host");

#[test]
fn cli_help() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--manifest",
        "--listen",
        "--state-dir",
        "--clock-offset-secs",
        "--follow-logs",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn cli_errors_are_one_line_and_exit_1() {
    let dir = TempDir::new("cli-errors");
    let manifest = write_manifest(
        &dir,
        r#"
[[trigger.http]]
route = "/x"
component = "missing"

[component.c]
source = "{{wasm}}"
"#,
    );
    let out = Command::new(BIN)
        .args([
            "--manifest",
            manifest.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("Error: "), "{stderr}");
    assert!(stderr.contains("`missing`"), "{stderr}");

    // Required variable missing.
    probe_wasm();
    let out = Command::new(BIN)
        .args([
            "--manifest",
            probe_manifest().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--state-dir", dir.path().join("state").to_str().unwrap()])
        .env_remove("SPIN_VARIABLE_API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SPIN_VARIABLE_API_TOKEN"), "{stderr}");
}

#[test]
fn cli_serves_the_app() {
    let state = TempDir::new("cli-serve");
    probe_wasm();
    let mut child = Command::new(BIN)
        .args([
            "--manifest",
            probe_manifest().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args([
            "--state-dir",
            state.path().to_str().unwrap(),
            "--clock-offset-secs",
            "-86400",
        ])
        .env("SPIN_VARIABLE_API_TOKEN", "cli-token")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("the host prints its address").unwrap();
        if let Some(url) = line.strip_prefix("Serving ") {
            break url.to_string();
        }
    };
    assert_eq!(lines.next().unwrap().unwrap(), "Available Routes:");
    let route_line = lines.next().unwrap().unwrap();
    assert!(
        route_line.starts_with("  probe: http://127.0.0.1:"),
        "{route_line}"
    );

    assert_eq!(get(&format!("{base}/hello")).text(), "hello");
    assert_eq!(get(&format!("{base}/vars/token")).text(), "cli-token");
    let guest = get(&format!("{base}/time")).json()["unixMs"]
        .as_i64()
        .unwrap();
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((real - guest - 86_400_000).abs() < 5_000);

    // One log line per request: method, path, component, status, duration.
    let log = loop {
        let line = lines.next().expect("a request log line").unwrap();
        if line.starts_with("GET /hello ") {
            break line;
        }
    };
    let fields: Vec<&str> = log.split(' ').collect();
    assert_eq!(&fields[..4], ["GET", "/hello", "probe", "200"], "{log}");
    assert!(fields[4].ends_with("ms"), "{log}");

    child.kill().unwrap();
    child.wait().unwrap();
}
