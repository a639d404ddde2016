//! A loaded app: the manifest turned into pre-instantiated components, a
//! routing table and the shared state behind the Spin interfaces.
//!
//! Loading is three steps ([`App::load`] runs them in order), and everything that can fail
//! does so in one of them, before the host listens:
//! - [`App::validate`]: a bad manifest, a bad runtime config, a route to an unknown
//!   component, an undefined store or database label, a required variable without a value, a
//!   missing `.wasm`;
//! - [`App::open_state`]: a state directory or database that cannot be created;
//! - [`App::compile`]: a `.wasm` that does not compile, or imports something this host does
//!   not provide.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::HostConfig;
use crate::clock::{ClockOffset, OffsetWallClock};
use crate::engine::{ComponentLoad, timed_load};
use crate::key_value::redis::RedisStore;
use crate::key_value::{self, KeyValueBackend, KeyValueState, KeyValueView, StoreBackend};
use crate::manifest::Manifest;
use crate::outbound_http::{AllowedHosts, Outbound, OutboundClient};
use crate::routes::Router;
use crate::runtime_config::{self as runtime, RuntimeConfig};
use crate::sqlite::libsql::LibsqlDatabase;
use crate::sqlite::{self, Database, Databases, SqliteState, SqliteView, StatementCounter};
use crate::telemetry::InstanceUsage;
use crate::variables::{self, Resolver, VariablesState};

/// The data of every per-request [`Store`].
pub struct HostState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: Outbound,
    kv: KeyValueState,
    sqlite: SqliteState,
    variables: VariablesState,
    pub(crate) usage: InstanceUsage,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// One component, ready to serve requests.
pub struct AppComponent {
    pub id: Arc<str>,
    pub(crate) pre: ProxyPre<HostState>,
    kv_allowed: Arc<HashSet<String>>,
    sqlite_allowed: Arc<HashSet<String>>,
    allowed_outbound_hosts: Arc<AllowedHosts>,
    environment: Vec<(String, String)>,
    stdout: LogSink,
    stderr: LogSink,
}

/// A loaded app.
pub struct App {
    pub manifest: Manifest,
    pub router: Router,
    pub components: BTreeMap<String, AppComponent>,
    pub state_dir: PathBuf,
    pub loads: Vec<ComponentLoad>,
    pub clock: ClockOffset,
    /// One line per label the runtime config defines (`[sqlite_database.default: libsql]`).
    pub runtime_config_summary: Vec<String>,
    kv: Arc<KeyStores>,
    databases: Arc<Databases>,
    files: StateFiles,
    resolver: Arc<Resolver>,
    /// The connection pool every instance's outbound HTTP shares.
    outbound: OutboundClient,
    /// Every statement the guests ran, for [`crate::Host::sqlite_statements`].
    pub statements: Arc<StatementCounter>,
}

/// A manifest that passed every check that needs no file but the manifest.
pub struct ValidApp {
    pub manifest: Manifest,
    pub router: Router,
    pub runtime_config: RuntimeConfig,
    resolver: Arc<Resolver>,
    /// Each component's `allowed_outbound_hosts`, rendered from the variables.
    allowed_outbound_hosts: HashMap<String, Arc<AllowedHosts>>,
}

/// The key-value stores of a host, by label.
pub type KeyStores = HashMap<String, StoreBackend>;

/// The local files behind store and database labels (remote ones have none).
#[derive(Default)]
struct StateFiles {
    key_value: HashMap<String, PathBuf>,
    sqlite: HashMap<String, PathBuf>,
}

/// The state an app's components share: the state directory, its logs, key-value store
/// and SQLite databases.
pub struct AppState {
    pub state_dir: PathBuf,
    logs: PathBuf,
    kv: Arc<KeyStores>,
    databases: Arc<Databases>,
    files: StateFiles,
}

/// The routed components, compiled and linked.
pub struct CompiledComponents {
    pub components: BTreeMap<String, AppComponent>,
    pub loads: Vec<ComponentLoad>,
}

impl App {
    /// Validates, opens the state, and compiles; CPU-heavy on a cold cache. `config` should
    /// be [resolved](HostConfig::resolve) (the host does that at start).
    pub fn load(config: &HostConfig) -> anyhow::Result<Self> {
        let valid = Self::validate(config)?;
        let state = Self::open_state(config, &valid)?;
        let compiled = Self::compile(config, &valid, &state)?;
        Ok(Self {
            manifest: valid.manifest,
            router: valid.router,
            components: compiled.components,
            state_dir: state.state_dir,
            loads: compiled.loads,
            clock: ClockOffset::new(config.clock_offset),
            runtime_config_summary: valid.runtime_config.summary(),
            kv: state.kv,
            databases: state.databases,
            files: state.files,
            resolver: valid.resolver,
            outbound: OutboundClient::new(valid.runtime_config.outbound_http_pooling),
            statements: Arc::new(StatementCounter::default()),
        })
    }

    /// Reads the manifest and the runtime config and checks what can be checked without
    /// opening anything: routes, store and database labels (each defined by the runtime
    /// config, or `default`), variables (a required one must have a value), and that every
    /// routed component's `.wasm` exists.
    pub fn validate(config: &HostConfig) -> anyhow::Result<ValidApp> {
        let manifest = Manifest::load(&config.manifest)?;
        for warning in &manifest.warnings {
            eprintln!("Warning: {warning}");
        }
        let router = Router::for_manifest(&manifest)?;
        for d in router.duplicates() {
            eprintln!(
                "Warning: route {:?} is given to both `{}` and `{}`; `{}` handles it",
                d.route, d.replaced_component, d.effective_component, d.effective_component
            );
        }

        let runtime_config = match &config.runtime_config {
            Some(path) => RuntimeConfig::load(path)?,
            None => RuntimeConfig::default(),
        };
        let undefined = |id: &str, what: &str, label: &str| {
            let hint = match &config.runtime_config {
                Some(path) => format!("the runtime config {} does not define it", path.display()),
                None => {
                    "without a runtime config (--runtime-config-file) only \"default\" is defined"
                        .to_owned()
                }
            };
            anyhow::anyhow!(
                "{}: component `{id}` uses {what} {label:?}, which is not defined: {hint}",
                manifest.path.display()
            )
        };
        for (id, c) in &manifest.components {
            if let Some(label) = c
                .key_value_stores
                .iter()
                .find(|label| !runtime_config.defines_key_value_store(label))
            {
                return Err(undefined(id, "key-value store", label));
            }
            if let Some(label) = c
                .sqlite_databases
                .iter()
                .find(|label| !runtime_config.defines_sqlite_database(label))
            {
                return Err(undefined(id, "SQLite database", label));
            }
        }

        let resolver = Arc::new(Resolver::new(&manifest, |name| config.env_var(name))?);
        let mut allowed_outbound_hosts = HashMap::new();
        for (id, c) in &manifest.components {
            let entries = &c.allowed_outbound_hosts;
            let hosts = match AllowedHosts::parse(entries, |t| resolver.render(t)) {
                Ok(hosts) => hosts,
                // As in Spin: an entry that is wrong as written stops the app; one that only a
                // variable's value makes wrong denies the component every outbound request.
                Err(e) if AllowedHosts::parse(entries, |_| Some(String::new())).is_ok() => {
                    eprintln!(
                        "Warning: component `{id}`: allowed_outbound_hosts: {e:#}; its outbound requests are denied"
                    );
                    AllowedHosts::default()
                }
                Err(e) => {
                    return Err(e.context(format!("component `{id}`: allowed_outbound_hosts")));
                }
            };
            allowed_outbound_hosts.insert(id.clone(), Arc::new(hosts));
        }

        for id in manifest.routed_components() {
            let c = &manifest.components[id];
            if !c.source.is_file() {
                let hint = c
                    .build_command
                    .clone()
                    .unwrap_or_else(|| "cargo build --target wasm32-wasip2 --release".to_string());
                bail!(
                    "component `{}`: {} does not exist; build it first (`{hint}`)",
                    c.id,
                    c.source.display()
                );
            }
        }
        Ok(ValidApp {
            manifest,
            router,
            runtime_config,
            resolver,
            allowed_outbound_hosts,
        })
    }

    /// Creates the state directory and opens what serves every store and database label a
    /// component uses (and `default`): local files are created and checked now; remote
    /// servers are reached on first use, as Spin does, so a replica starts while its stores
    /// are still coming up.
    pub fn open_state(config: &HostConfig, valid: &ValidApp) -> anyhow::Result<AppState> {
        let (manifest, runtime_config) = (&valid.manifest, &valid.runtime_config);
        let state_dir = config
            .state_dir
            .clone()
            .or_else(|| runtime_config.state_dir.clone())
            .unwrap_or_else(|| manifest.dir.join(".spin"));
        let logs = state_dir.join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create the state directory {}", logs.display()))?;
        let mut kv_labels: BTreeSet<&str> = [runtime::DEFAULT_LABEL].into();
        let mut sqlite_labels: BTreeSet<&str> = [runtime::DEFAULT_LABEL].into();
        for c in manifest.components.values() {
            kv_labels.extend(c.key_value_stores.iter().map(String::as_str));
            sqlite_labels.extend(c.sqlite_databases.iter().map(String::as_str));
        }
        let mut files = StateFiles::default();
        // Labels on one file share what serves it.
        let mut open_kv_files: HashMap<PathBuf, Arc<KeyValueBackend>> = HashMap::new();
        let mut kv = KeyStores::new();
        for label in kv_labels {
            let backend = match runtime_config.key_value_store(label, &state_dir) {
                Some(runtime::KeyValueStore::Local { path }) => {
                    files.key_value.insert(label.to_owned(), path.clone());
                    let open = match open_kv_files.get(&path) {
                        Some(open) => open.clone(),
                        None => Arc::new(KeyValueBackend::open(&path)?),
                    };
                    open_kv_files.insert(path, open.clone());
                    StoreBackend::Local(open)
                }
                Some(runtime::KeyValueStore::Redis { url }) => {
                    StoreBackend::Redis(Arc::new(RedisStore::new(&url).with_context(|| {
                        format!("key-value store {label:?}: Invalid Redis URL")
                    })?))
                }
                None => continue,
            };
            kv.insert(label.to_owned(), backend);
        }
        let mut open_databases: HashMap<PathBuf, Arc<dyn Database>> = HashMap::new();
        let mut databases = Databases::new();
        for label in sqlite_labels {
            let backend: Arc<dyn Database> = match runtime_config.sqlite_database(label, &state_dir)
            {
                Some(runtime::SqliteDatabase::Local { path }) => {
                    files.sqlite.insert(label.to_owned(), path.clone());
                    let open = match open_databases.get(&path) {
                        Some(open) => open.clone(),
                        None => sqlite::open_local(config.sqlite_mode, &path)?,
                    };
                    open_databases.insert(path, open.clone());
                    open
                }
                Some(runtime::SqliteDatabase::Libsql { url, token }) => {
                    Arc::new(LibsqlDatabase::new(&url, &token))
                }
                None => continue,
            };
            databases.insert(label.to_owned(), backend);
        }
        Ok(AppState {
            state_dir,
            logs,
            kv: Arc::new(kv),
            databases: Arc::new(databases),
            files,
        })
    }

    /// Compiles (or fetches from the caches) every routed component and links it against
    /// what this host provides. Only components that a route (or a private trigger) uses
    /// are loaded.
    pub fn compile(
        config: &HostConfig,
        valid: &ValidApp,
        state: &AppState,
    ) -> anyhow::Result<CompiledComponents> {
        let manifest = &valid.manifest;
        let engine = crate::engine::engine_with(config.perf_map);
        let linker = linker(engine)?;
        let disk_cache = config.disk_cache_dir();
        let mut components = BTreeMap::new();
        let mut loads = Vec::new();
        for id in manifest.routed_components() {
            let c = &manifest.components[id];
            let (component, load) = timed_load(&c.id, &c.source, disk_cache)
                .with_context(|| format!("component `{}`", c.id))?;
            loads.push(load);
            let pre = linker
                .instantiate_pre(&component)
                .map_err(anyhow::Error::from)
                .and_then(|pre| ProxyPre::new(pre).map_err(anyhow::Error::from))
                .with_context(|| {
                    format!(
                        "component `{}` ({}) cannot run on this host (it must export wasi:http/incoming-handler@0.2 and import only WASI 0.2, wasi:http and fermyon:spin key-value/sqlite/variables)",
                        c.id,
                        c.source.display()
                    )
                })?;
            components.insert(
                c.id.clone(),
                AppComponent {
                    id: Arc::from(c.id.as_str()),
                    pre,
                    kv_allowed: Arc::new(c.key_value_stores.iter().cloned().collect()),
                    sqlite_allowed: Arc::new(c.sqlite_databases.iter().cloned().collect()),
                    allowed_outbound_hosts: valid.allowed_outbound_hosts[&c.id].clone(),
                    environment: c.environment.clone().into_iter().collect(),
                    stdout: LogSink::open(
                        &state.logs.join(format!("{}_stdout.txt", c.id)),
                        &c.id,
                        config.follow_logs,
                        false,
                    )?,
                    stderr: LogSink::open(
                        &state.logs.join(format!("{}_stderr.txt", c.id)),
                        &c.id,
                        config.follow_logs,
                        true,
                    )?,
                },
            );
        }
        Ok(CompiledComponents { components, loads })
    }

    /// A fresh store for one request to `component`; its statements are counted in
    /// `statements` (and in the host's count).
    pub(crate) fn new_store(
        &self,
        component: &AppComponent,
        statements: Arc<StatementCounter>,
    ) -> Store<HostState> {
        let mut wasi = WasiCtx::builder();
        wasi.stdout(component.stdout.clone())
            .stderr(component.stderr.clone())
            .wall_clock(OffsetWallClock(self.clock.clone()))
            .envs(&component.environment);
        let state = HostState {
            table: ResourceTable::new(),
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            hooks: Outbound {
                allowed: component.allowed_outbound_hosts.clone(),
                client: self.outbound.clone(),
            },
            kv: KeyValueState {
                allowed: component.kv_allowed.clone(),
                stores: self.kv.clone(),
            },
            sqlite: SqliteState {
                allowed: component.sqlite_allowed.clone(),
                databases: self.databases.clone(),
                request: statements,
                host: self.statements.clone(),
                open_connections: Default::default(),
            },
            variables: VariablesState {
                component: component.id.clone(),
                resolver: self.resolver.clone(),
            },
            usage: InstanceUsage::new(component.id.clone()),
        };
        let mut store = Store::new(crate::engine::engine(), state);
        crate::engine::configure_store(&mut store);
        store.limiter(|state| &mut state.usage);
        if InstanceUsage::measured() {
            store.call_hook(|mut store, hook| {
                store.data_mut().usage.on_call(hook);
                Ok(())
            });
        }
        store
    }

    /// The file of a local key-value store (`None`: not defined, or not a local file).
    pub fn kv_path(&self, label: &str) -> Option<&Path> {
        self.files.key_value.get(label).map(PathBuf::as_path)
    }

    /// The file of a local database (`None`: not defined, or not a local file).
    pub fn sqlite_path(&self, label: &str) -> Option<&Path> {
        self.files.sqlite.get(label).map(PathBuf::as_path)
    }
}

fn linker(engine: &Engine) -> anyhow::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    crate::bindings::fermyon::spin::key_value::add_to_linker::<_, key_value::KeyValue>(
        &mut linker,
        kv_view,
    )?;
    crate::bindings::wasi::keyvalue::store::add_to_linker::<_, key_value::KeyValue>(
        &mut linker,
        kv_view,
    )?;
    crate::bindings::wasi::keyvalue::atomics::add_to_linker::<_, key_value::KeyValue>(
        &mut linker,
        kv_view,
    )?;
    crate::bindings::fermyon::spin::sqlite::add_to_linker::<_, sqlite::Sqlite>(
        &mut linker,
        sqlite_view,
    )?;
    crate::bindings::fermyon::spin::variables::add_to_linker::<_, variables::Variables>(
        &mut linker,
        variables_state,
    )?;
    Ok(linker)
}

fn kv_view(s: &mut HostState) -> KeyValueView<'_> {
    KeyValueView {
        state: &s.kv,
        table: &mut s.table,
    }
}

fn sqlite_view(s: &mut HostState) -> SqliteView<'_> {
    SqliteView {
        state: &s.sqlite,
        table: &mut s.table,
    }
}

fn variables_state(s: &mut HostState) -> &mut VariablesState {
    &mut s.variables
}

/// A component's stdout or stderr: appended to its log file under
/// `<state-dir>/logs/`, copied to the host's stderr with `--follow-logs`, and each write a
/// log record when logs are exported (see [`crate::telemetry::app_log`]).
#[derive(Clone)]
pub struct LogSink {
    file: Arc<File>,
    component: Arc<str>,
    follow: bool,
    is_stderr: bool,
}

impl LogSink {
    fn open(path: &Path, component: &str, follow: bool, is_stderr: bool) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open log file {}", path.display()))?;
        Ok(Self {
            file: Arc::new(file),
            component: Arc::from(component),
            follow,
            is_stderr,
        })
    }

    fn write_all(&self, bytes: &[u8]) -> std::io::Result<()> {
        crate::telemetry::app_log(bytes, &self.component);
        (&*self.file).write_all(bytes)?;
        if self.follow {
            let _ = if self.is_stderr {
                std::io::stderr().write_all(bytes)
            } else {
                std::io::stdout().write_all(bytes)
            };
        }
        Ok(())
    }
}

impl IsTerminal for LogSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogSink {
    async fn ready(&mut self) {}
}

impl OutputStream for LogSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_all(&bytes)
            .map_err(|e| StreamError::LastOperationFailed(wasmtime::format_err!(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LogSink {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(self.write_all(buf).map(|()| buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
