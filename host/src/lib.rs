//! The project's own Spin host: runs a `spin.toml` the way `spin up` does, on
//! wasmtime, for CI and for machines without the `spin` CLI.
//!
//! - [`config`]: every setting, the environment read once at start
//! - [`manifest`]: `spin.toml` v2, as serde types ([`manifest::schema`]) and checked
//! - [`routes`]: Spin's route matching and precedence
//! - [`headers`]: the `spin-*` request headers
//! - [`server`]: hyper, one fresh component instance per request
//! - [`key_value`], [`sqlite`], [`variables`]: the `fermyon:spin@2.0.0` interfaces; SQLite
//!   runs as Spin runs it, or tuned ([`SqliteMode`]), and counts statements
//! - [`outbound_http`]: `wasi:http/outgoing-handler`, to `allowed_outbound_hosts` only, one
//!   connection pool per app
//! - [`runtime_config`]: Spin's runtime config file, which puts store and database labels
//!   on local files, a libSQL server ([`sqlite::libsql`]) or Redis ([`key_value::redis`])
//! - [`telemetry`]: traces, metrics and logs over OTLP, as Spin exports them
//! - [`clock`]: the guests' wall clock, with an offset tests can move
//! - [`engine`]: the wasmtime engine and compiled-component caches
//! - [`app`]: a manifest validated, its state opened, its components compiled
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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
pub use chrono::TimeDelta;

pub mod app;
pub mod clock;
pub mod config;
pub mod engine;
pub mod headers;
pub mod key_value;
pub mod manifest;
pub mod outbound_http;
pub mod routes;
pub mod runtime_config;
pub mod server;
pub mod sqlite;
pub mod telemetry;
pub mod variables;

pub use config::HostConfig;
pub use engine::{ComponentLoad, LoadSource};
pub use server::Server;
pub use sqlite::{SqliteMode, StatementCounts};

/// Host-side bindings of this crate's `wit/spin.wit`.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "host",
        imports: { default: async | trappable },
        with: {
            "fermyon:spin/key-value.store": crate::key_value::KvStore,
            "fermyon:spin/sqlite.connection": crate::sqlite::SqliteConnection,
            "wasi:keyvalue/store.bucket": crate::key_value::KvStore,
        },
    });
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
    statements: Arc<sqlite::StatementCounter>,
}

impl Host {
    /// Loads the app, compiles (or fetches from cache) its components, and
    /// listens. Errors are the host's start-up errors (bad manifest, missing
    /// `.wasm`, required variable without a value, port in use, …).
    pub fn start(config: HostConfig) -> anyhow::Result<Host> {
        let config = config.resolve();
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
        let statements = app.statements.clone();
        let server = runtime.block_on(Server::serve(app, &config))?;
        Ok(Host {
            addr: server.addr(),
            runtime: Some(runtime),
            server: Some(server),
            state_dir,
            clock,
            loads,
            statements,
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

    /// Stops the guests' wall clock at `at` (to look at a boundary exactly) until the
    /// next [`Host::set_clock_offset`] or [`Host::unfreeze_clock`].
    pub fn freeze_clock_at(&self, at: chrono::DateTime<chrono::Utc>) {
        self.clock
            .freeze_at(at.timestamp_nanos_opt().unwrap_or(i64::MAX));
    }

    /// Lets the guests' wall clock run again, with the offset it had.
    pub fn unfreeze_clock(&self) {
        self.clock.unfreeze();
    }

    pub fn clock_offset(&self) -> TimeDelta {
        self.clock.get()
    }

    /// How each component was loaded (memory cache, disk cache, compiled) and how long it took.
    pub fn component_loads(&self) -> &[ComponentLoad] {
        &self.loads
    }

    /// Every SQLite statement the guests have run so far, and how many of them inside a
    /// write transaction. The difference across a request is what that request cost (all of
    /// a request's statements are counted before its response is sent).
    pub fn sqlite_statements(&self) -> StatementCounts {
        self.statements.get()
    }

    /// How many SQLite statements the components have run so far on the database labelled
    /// `label`.
    pub fn sqlite_statements_of(&self, label: &str) -> u64 {
        self.statements.of_label(label)
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
