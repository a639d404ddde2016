//! Every setting of a host, in one place: [`HostConfig`] is what the caller (the CLI, a
//! test) asks for; [`HostConfig::resolve`] reads the process environment, once, at start,
//! and fills in what the environment decides. Nothing else in the host reads the
//! environment.
//!
//! Read at start, when [`HostConfig::inherit_env`] is set (the CLI sets it):
//! - `SPIN_VARIABLE_<NAME>`: application variables (values given in [`HostConfig::env`] win);
//! - `SPIN_HOST_PROFILER=perfmap`: the engine writes `/tmp/perf-<pid>.map` for `perf`.
//!
//! Read at start whatever `inherit_env` says, when no cache directory is given:
//! - `SPIN_HOST_CACHE_DIR`, else `$CARGO_TARGET_DIR/spin-host-cache`, else
//!   `target/spin-host-cache` of this workspace: where compiled components are kept.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use chrono::TimeDelta;

use crate::sqlite::SqliteMode;

/// The prefix of the environment variables that give application variables their values.
pub const VARIABLE_ENV_PREFIX: &str = "SPIN_VARIABLE_";

/// How to run an app.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Path of `spin.toml`; relative paths in it are resolved against its directory.
    pub manifest: PathBuf,
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// State directory (databases, logs); `None` is the runtime config's `state_dir`, else
    /// `.spin` beside the manifest.
    pub state_dir: Option<PathBuf>,
    /// Spin's runtime config file (`--runtime-config-file`): which backend serves each
    /// database and key-value store label. `None`: local files in the state directory.
    pub runtime_config: Option<PathBuf>,
    /// Environment variables seen by the host (e.g. `SPIN_VARIABLE_*`), taking
    /// precedence over the process environment.
    pub env: HashMap<String, String>,
    /// Whether to also read the process environment (at start, see [`HostConfig::resolve`]).
    pub inherit_env: bool,
    /// Initial offset of the guests' wall clock.
    pub clock_offset: TimeDelta,
    /// Copy component stdout/stderr to the host's stdout/stderr too.
    pub follow_logs: bool,
    /// Print one line per request to stdout.
    pub log_requests: bool,
    /// Print `Serving http://…` and the routes once listening.
    pub print_banner: bool,
    /// Keep compiled components on disk between runs.
    pub disk_cache: bool,
    /// Where; `None` is decided at start (see the module documentation).
    pub cache_dir: Option<PathBuf>,
    /// How the SQLite interface runs statements: like Spin (the default) or tuned.
    pub sqlite_mode: SqliteMode,
    /// Write a perf map of the guests' functions (`SPIN_HOST_PROFILER=perfmap`).
    pub perf_map: bool,
}

impl HostConfig {
    /// Defaults for tests: `127.0.0.1:0`, no process environment, no output.
    pub fn new(manifest: impl Into<PathBuf>) -> Self {
        Self {
            manifest: manifest.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir: None,
            runtime_config: None,
            env: HashMap::new(),
            inherit_env: false,
            clock_offset: TimeDelta::zero(),
            follow_logs: false,
            log_requests: false,
            print_banner: false,
            disk_cache: true,
            cache_dir: None,
            sqlite_mode: SqliteMode::default(),
            perf_map: false,
        }
    }

    /// Sets one environment variable for the host.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets the state directory.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Sets the runtime config file.
    pub fn runtime_config(mut self, path: impl Into<PathBuf>) -> Self {
        self.runtime_config = Some(path.into());
        self
    }

    /// Sets the listen address.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Sets the initial clock offset.
    pub fn clock_offset(mut self, offset: TimeDelta) -> Self {
        self.clock_offset = offset;
        self
    }

    /// Sets how the SQLite interface runs statements.
    pub fn sqlite_mode(mut self, mode: SqliteMode) -> Self {
        self.sqlite_mode = mode;
        self
    }

    /// The config with everything the process environment decides read into it: the only
    /// place the host reads the environment. Idempotent.
    pub fn resolve(mut self) -> Self {
        if self.inherit_env {
            for (name, value) in std::env::vars() {
                if name.starts_with(VARIABLE_ENV_PREFIX) {
                    self.env.entry(name).or_insert(value);
                }
            }
            if std::env::var("SPIN_HOST_PROFILER").is_ok_and(|p| p == "perfmap") {
                self.perf_map = true;
            }
        }
        if self.disk_cache && self.cache_dir.is_none() {
            self.cache_dir = Some(default_cache_dir(
                std::env::var_os("SPIN_HOST_CACHE_DIR").map(PathBuf::from),
                std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
            ));
        }
        // Later calls must not read the environment again, nor read it twice.
        self.inherit_env = false;
        self
    }

    /// The value of one of the host's environment variables (after [`HostConfig::resolve`]).
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned()
    }

    /// Where compiled components are kept, if anywhere (after [`HostConfig::resolve`]).
    pub fn disk_cache_dir(&self) -> Option<&Path> {
        self.disk_cache
            .then_some(self.cache_dir.as_deref())
            .flatten()
    }
}

/// The cache directory when none is given: `$SPIN_HOST_CACHE_DIR`, else
/// `$CARGO_TARGET_DIR/spin-host-cache`, else this workspace's `target/spin-host-cache`.
pub fn default_cache_dir(cache_dir: Option<PathBuf>, target_dir: Option<PathBuf>) -> PathBuf {
    if let Some(dir) = cache_dir {
        return dir;
    }
    if let Some(target) = target_dir {
        return target.join("spin-host-cache");
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("target")
        .join("spin-host-cache")
}
