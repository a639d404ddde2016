//! The probe fixture of the host's own suites: a component that exercises each Spin
//! interface, and manifests that run it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use spin_host::{Host, HostConfig};

use crate::paths::{target_dir, workspace};
use crate::temp::TempDir;

/// `host/fixtures/probe/spin.toml`.
pub fn probe_manifest() -> PathBuf {
    workspace().join("host/fixtures/probe/spin.toml")
}

/// The built probe component, built once per process if it is missing.
pub fn probe_wasm() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let wasm = target_dir().join("wasm32-wasip2/release/probe.wasm");
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
