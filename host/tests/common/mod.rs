//! Helpers shared by the integration tests: the probe fixture, temporary
//! directories and a small blocking HTTP client.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use spin_host::{Host, HostConfig};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `host/fixtures/probe/spin.toml`.
pub fn probe_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/probe/spin.toml")
}

/// The built probe component, built once per process if it is missing.
pub fn probe_wasm() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace().join("target"));
            let wasm = target.join("wasm32-wasip2/release/probe.wasm");
            if !wasm.is_file() {
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                let status = Command::new(cargo)
                    .args([
                        "build",
                        "--target",
                        "wasm32-wasip2",
                        "--release",
                        "-p",
                        "probe",
                    ])
                    .current_dir(workspace())
                    .status()
                    .expect("run cargo to build the probe component");
                assert!(status.success(), "building probe.wasm failed");
            }
            assert!(wasm.is_file(), "{} missing after the build", wasm.display());
            wasm
        })
        .clone()
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "spin-host-test-{}-{}-{name}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A config for the probe app with its required variable set and a fresh state dir.
pub fn probe_config(state: &TempDir) -> HostConfig {
    probe_wasm();
    HostConfig::new(probe_manifest())
        .state_dir(state.path())
        .env("SPIN_VARIABLE_API_TOKEN", "test-token")
}

/// Starts the probe app.
pub fn start_probe(state: &TempDir) -> Host {
    Host::start(probe_config(state)).expect("the probe app starts")
}

/// Writes a manifest into `dir` whose components all run the probe, with the
/// given `[[trigger.http]]`/`[component]` body appended. `{{wasm}}` in `body`
/// is replaced with the probe's absolute path.
pub fn write_manifest(dir: &TempDir, body: &str) -> PathBuf {
    let wasm = probe_wasm().canonicalize().expect("probe.wasm path");
    let text = format!(
        "spin_manifest_version = 2\n[application]\nname = \"test\"\n{}",
        body.replace("{{wasm}}", &wasm.display().to_string().replace('\\', "/"))
    );
    let path = dir.path().join("spin.toml");
    std::fs::write(&path, text).expect("write manifest");
    path
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build();
        ureq::Agent::new_with_config(config)
    })
}

fn reply(result: Result<http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = result.expect("HTTP request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.body_mut().read_to_vec().expect("read body");
    Reply {
        status,
        headers,
        body,
    }
}

pub fn get(url: &str) -> Reply {
    reply(agent().get(url).call())
}

pub fn get_with(url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = agent().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    reply(req.call())
}

pub fn post(url: &str, body: impl AsRef<[u8]>) -> Reply {
    reply(agent().post(url).send(body.as_ref()))
}

pub fn post_json(url: &str, body: &serde_json::Value) -> Reply {
    reply(
        agent()
            .post(url)
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes()),
    )
}
