//! The `spin-host` binary as a process of its own, for suites that kill it or run several.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::app::{AUDIT_KEY, OPERATOR_TOKEN, ensure_components_built};
use crate::paths::workspace;
use reservations_store::share::{EDGE_FEED_REQUESTS_PER_TOKEN, EDGE_WRITE_SHARE};

/// The `spin-host` binary at `binary` (a test passes `env!("CARGO_BIN_EXE_spin-host")`)
/// serving the app with its state in `state_dir` on a free port, its stderr appended to
/// `log`; `extra_args` go to its command line. Returns the process and the base URL it
/// printed once serving (its stdout is drained from then on).
pub fn spawn_spin_host(
    binary: &Path,
    state_dir: &Path,
    log: std::fs::File,
    extra_args: &[&OsStr],
) -> (Child, String) {
    spawn_spin_host_with_env(binary, state_dir, log, extra_args, &[])
}

/// [`spawn_spin_host`] with more of the process's environment (`OTEL_*`, `SPIN_VARIABLE_*`).
pub fn spawn_spin_host_with_env(
    binary: &Path,
    state_dir: &Path,
    log: std::fs::File,
    extra_args: &[&OsStr],
    env: &[(&str, &str)],
) -> (Child, String) {
    ensure_components_built();
    let default_manifest = workspace().join("spin.toml");
    let manifest: &[&OsStr] = match extra_args.contains(&OsStr::new("--manifest")) {
        true => &[],
        false => &[OsStr::new("--manifest"), default_manifest.as_os_str()],
    };
    let mut child = Command::new(binary)
        .args(manifest)
        .args(extra_args)
        .args(["--listen", "127.0.0.1:0", "--quiet", "--state-dir"])
        .arg(state_dir)
        .env("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("SPIN_VARIABLE_AUDIT_KEY", AUDIT_KEY)
        .envs(edge_settings(extra_args))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn spin-host");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("spin-host exited before serving")
            .expect("read stdout");
        if let Some(url) = line.strip_prefix("Serving ") {
            break url.to_owned();
        }
    };
    // Keep the pipe drained so the host never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    (child, base)
}

/// The variables an app on a runtime config (the test stores' sqld and Redis) runs with, as
/// at the edge: each org's write share and each token's feed requests, counted in Redis.
fn edge_settings(extra_args: &[&OsStr]) -> Vec<(&'static str, String)> {
    let on_runtime_config = extra_args.iter().any(|arg| *arg == "--runtime-config-file");
    match on_runtime_config {
        true => vec![
            (
                "SPIN_VARIABLE_ORG_WRITE_SHARE",
                EDGE_WRITE_SHARE.to_string(),
            ),
            (
                "SPIN_VARIABLE_FEED_REQUESTS_PER_TOKEN",
                EDGE_FEED_REQUESTS_PER_TOKEN.to_string(),
            ),
        ],
        false => Vec::new(),
    }
}

/// A `spin-host` process serving the app, SIGKILLed and reaped when dropped.
pub struct HostProcess {
    child: Child,
    pub base: String,
}

impl HostProcess {
    /// Starts the binary at `binary` as [`spawn_spin_host`] does.
    pub fn spawn(
        binary: &Path,
        state_dir: &Path,
        log: std::fs::File,
        extra_args: &[&OsStr],
    ) -> HostProcess {
        HostProcess::spawn_with_env(binary, state_dir, log, extra_args, &[])
    }

    /// Starts the binary at `binary` as [`spawn_spin_host_with_env`] does.
    pub fn spawn_with_env(
        binary: &Path,
        state_dir: &Path,
        log: std::fs::File,
        extra_args: &[&OsStr],
        env: &[(&str, &str)],
    ) -> HostProcess {
        let (child, base) = spawn_spin_host_with_env(binary, state_dir, log, extra_args, env);
        HostProcess { child, base }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL spin-host");
        self.child.wait().expect("reap spin-host");
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
