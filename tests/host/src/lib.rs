//! The project's own Spin host: runs a `spin.toml` the way `spin up` does, on
//! wasmtime, for CI and for machines without the `spin` CLI.
//!
//! - [`manifest`]: `spin.toml` v2
//! - [`routes`]: Spin's route matching and precedence
//! - [`headers`]: the `spin-*` request headers
//! - [`server`]: hyper, one fresh component instance per request
//! - [`key_value`], [`sqlite`], [`variables`]: the `fermyon:spin@2.0.0` interfaces
//! - [`runtime_config`]: Spin's runtime config file, which puts store and database labels
//!   on local files, a libSQL server ([`libsql_backend`]) or Redis ([`redis_backend`])
//! - [`clock`]: the guests' wall clock, with an offset tests can move
//! - [`engine`]: the wasmtime engine and compiled-component caches
//! - [`app`]: a manifest loaded into runnable components
//!
//! For tests, [`Host`] runs a server on its own runtime thread:
//!
//! ```no_run
//! let host = spin_host::Host::start(
//!     spin_host::HostConfig::new("spin.toml").env("SPIN_VARIABLE_OPERATOR_TOKEN", "t"),
//! )?;
//! let url = format!("{}/v1/healthz", host.base_url());
//! host.set_clock_offset(chrono::TimeDelta::days(1));
//! # anyhow::Ok(())
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
pub use chrono::TimeDelta;

pub mod app;
pub mod clock;
pub mod engine;
pub mod headers;
pub mod key_value;
pub mod libsql_backend;
pub mod manifest;
pub mod redis_backend;
pub mod routes;
pub mod runtime_config;
pub mod server;
pub mod sqlite;
pub mod variables;

pub use engine::{ComponentLoad, LoadSource};
pub use server::Server;

/// Host-side bindings of this crate's `wit/spin.wit`.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "host",
        imports: { default: async | trappable },
        with: {
            "fermyon:spin/key-value.store": crate::key_value::KvStore,
            "fermyon:spin/sqlite.connection": crate::sqlite::GuestConnection,
        },
    });
}

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
    /// Whether to also read the process environment.
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
    /// Where; `None` is `target/spin-host-cache` (see [`engine::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
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
}

/// A running host with its own tokio runtime, for plain `#[test]`s.
/// Shuts down when dropped.
pub struct Host {
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<Server>,
    addr: SocketAddr,
    state_dir: PathBuf,
    clock: clock::ClockOffset,
    loads: Vec<ComponentLoad>,
}

impl Host {
    /// Loads the app, compiles (or fetches from cache) its components, and
    /// listens. Errors are the host's start-up errors (bad manifest, missing
    /// `.wasm`, required variable without a value, port in use, …).
    pub fn start(config: HostConfig) -> anyhow::Result<Host> {
        let app = app::App::load(&config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spin-host")
            .enable_all()
            .build()
            .context("cannot start the tokio runtime")?;
        let state_dir = app.state_dir.clone();
        let clock = app.clock.clone();
        let loads = app.loads.clone();
        let server = runtime.block_on(Server::serve(app, &config))?;
        Ok(Host {
            addr: server.addr(),
            runtime: Some(runtime),
            server: Some(server),
            state_dir,
            clock,
            loads,
        })
    }

    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state directory (databases and `logs/`).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Moves the guests' wall clock: real time plus `offset` (may be negative).
    pub fn set_clock_offset(&self, offset: TimeDelta) {
        self.clock.set(offset);
    }

    pub fn clock_offset(&self) -> TimeDelta {
        self.clock.get()
    }

    /// How each component was loaded (memory cache, disk cache, compiled) and how long it took.
    pub fn component_loads(&self) -> &[ComponentLoad] {
        &self.loads
    }

    /// Stops the server and its runtime.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let (Some(runtime), Some(server)) = (self.runtime.take(), self.server.take()) else {
            return;
        };
        // Dropping a runtime inside another runtime's thread panics: do it on
        // a thread of our own.
        let stopper = std::thread::spawn(move || {
            runtime.block_on(server.shutdown());
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        });
        let _ = stopper.join();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}
