//! A loaded app: the manifest turned into pre-instantiated components, a
//! routing table and the shared state behind the Spin interfaces.
//!
//! Everything that can fail does so here, before the host listens: a bad
//! manifest, a bad runtime config, a route to an unknown component, a missing
//! `.wasm`, an undefined store or database label, a required variable without a
//! value, or a component importing something this host does not provide.

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
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::HostConfig;
use crate::clock::{ClockOffset, OffsetWallClock};
use crate::engine::{ComponentLoad, engine, timed_load};
use crate::key_value::{self, KeyValueBackend, KeyValueState, KeyValueView, StoreBackend};
use crate::libsql_backend::LibsqlDatabase;
use crate::manifest::{ComponentConfig, Manifest};
use crate::redis_backend::RedisStore;
use crate::routes::Router;
use crate::runtime_config::{self as config, RuntimeConfig};
use crate::sqlite::{self, ConnectionPool, DatabaseBackend, SqliteState, SqliteView};
use crate::variables::{self, Resolver, VariablesState};

/// The data of every per-request [`Store`].
pub struct HostState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: DenyOutbound,
    kv: KeyValueState,
    sqlite: SqliteState,
    variables: VariablesState,
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

/// Outbound HTTP is denied, as for a Spin component without
/// `allowed_outbound_hosts`.
struct DenyOutbound;

impl WasiHttpHooks for DenyOutbound {
    #[allow(clippy::type_complexity)]
    fn send_request(
        &mut self,
        _request: http::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<wasmtime_wasi_http::WasiBody>,
                    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
                )>,
            > + Send,
    > {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}

/// One component, ready to serve requests.
pub struct AppComponent {
    pub id: Arc<str>,
    pub(crate) pre: ProxyPre<HostState>,
    kv_allowed: Arc<HashSet<String>>,
    sqlite_allowed: Arc<HashSet<String>>,
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
    kv: Arc<HashMap<String, StoreBackend>>,
    sqlite: Arc<HashMap<String, DatabaseBackend>>,
    resolver: Arc<Resolver>,
}

impl App {
    /// Loads, validates and compiles everything; CPU-heavy on a cold cache.
    pub fn load(config: &HostConfig) -> anyhow::Result<Self> {
        let manifest = Manifest::load(&config.manifest)?;
        for warning in &manifest.warnings {
            eprintln!("Warning: {warning}");
        }
        let routes: Vec<(&str, &str)> = manifest
            .http_triggers
            .iter()
            .filter_map(|t| t.route.as_deref().map(|r| (r, t.component.as_str())))
            .collect();
        let router = Router::build(routes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", manifest.path.display()))?;
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
        let state_dir = config
            .state_dir
            .clone()
            .or_else(|| runtime_config.state_dir.clone())
            .unwrap_or_else(|| manifest.dir.join(".spin"));
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
            for label in &c.key_value_stores {
                if runtime_config.key_value_store(label, &state_dir).is_none() {
                    return Err(undefined(id, "key-value store", label));
                }
            }
            for label in &c.sqlite_databases {
                if runtime_config.sqlite_database(label, &state_dir).is_none() {
                    return Err(undefined(id, "SQLite database", label));
                }
            }
        }

        let env = |name: &str| {
            config.env.get(name).cloned().or_else(|| {
                config
                    .inherit_env
                    .then(|| std::env::var(name).ok())
                    .flatten()
            })
        };
        let resolver = Arc::new(Resolver::new(&manifest, env)?);

        // Only components that a route (or a private trigger) uses are loaded.
        let used: Vec<&ComponentConfig> = manifest
            .routed_components()
            .into_iter()
            .map(|id| &manifest.components[id])
            .collect();
        for c in &used {
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

        let logs = state_dir.join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create the state directory {}", logs.display()))?;
        let (kv, sqlite) = open_stores(&manifest, &runtime_config, &state_dir)?;

        let linker = linker(engine())?;
        let disk_cache = config.disk_cache.then(|| {
            config
                .cache_dir
                .clone()
                .unwrap_or_else(crate::engine::default_cache_dir)
        });
        let mut components = BTreeMap::new();
        let mut loads = Vec::new();
        for c in used {
            let (component, load) = timed_load(&c.id, &c.source, disk_cache.as_deref())
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
                    environment: c.environment.clone().into_iter().collect(),
                    stdout: LogSink::open(
                        &logs.join(format!("{}_stdout.txt", c.id)),
                        config.follow_logs,
                        false,
                    )?,
                    stderr: LogSink::open(
                        &logs.join(format!("{}_stderr.txt", c.id)),
                        config.follow_logs,
                        true,
                    )?,
                },
            );
        }

        Ok(Self {
            manifest,
            router,
            components,
            state_dir,
            loads,
            clock: ClockOffset::new(config.clock_offset),
            runtime_config_summary: runtime_config.summary(),
            kv: Arc::new(kv),
            sqlite: Arc::new(sqlite),
            resolver,
        })
    }

    /// A fresh store for one request to `component`.
    pub(crate) fn new_store(&self, component: &AppComponent) -> Store<HostState> {
        let mut wasi = WasiCtx::builder();
        wasi.stdout(component.stdout.clone())
            .stderr(component.stderr.clone())
            .wall_clock(OffsetWallClock(self.clock.clone()))
            .envs(&component.environment);
        let state = HostState {
            table: ResourceTable::new(),
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            hooks: DenyOutbound,
            kv: KeyValueState {
                allowed: component.kv_allowed.clone(),
                stores: self.kv.clone(),
            },
            sqlite: SqliteState {
                allowed: component.sqlite_allowed.clone(),
                databases: self.sqlite.clone(),
            },
            variables: VariablesState {
                component: component.id.clone(),
                resolver: self.resolver.clone(),
            },
        };
        let mut store = Store::new(engine(), state);
        crate::engine::configure_store(&mut store);
        store
    }

    /// The file of a local key-value store (`None`: not defined, or not a local file).
    pub fn kv_path(&self, label: &str) -> Option<&Path> {
        match self.kv.get(label)? {
            StoreBackend::Local(local) => Some(local.path()),
            StoreBackend::Redis(_) => None,
        }
    }

    /// The file of a local database (`None`: not defined, or not a local file).
    pub fn sqlite_path(&self, label: &str) -> Option<&Path> {
        match self.sqlite.get(label)? {
            DatabaseBackend::Local(pool) => Some(pool.path()),
            DatabaseBackend::Libsql(_) => None,
        }
    }
}

type Stores = (
    HashMap<String, StoreBackend>,
    HashMap<String, DatabaseBackend>,
);

/// Opens what serves every label a component uses (and `default`): local files are created
/// and checked now; remote servers are reached on first use, as Spin does, so a replica
/// starts while its stores are still coming up.
fn open_stores(
    manifest: &Manifest,
    runtime_config: &RuntimeConfig,
    state_dir: &Path,
) -> anyhow::Result<Stores> {
    let mut kv_labels: BTreeSet<&str> = [config::DEFAULT_LABEL].into();
    let mut sqlite_labels: BTreeSet<&str> = [config::DEFAULT_LABEL].into();
    for c in manifest.components.values() {
        kv_labels.extend(c.key_value_stores.iter().map(String::as_str));
        sqlite_labels.extend(c.sqlite_databases.iter().map(String::as_str));
    }
    let mut files: HashMap<PathBuf, Arc<KeyValueBackend>> = HashMap::new();
    let mut kv = HashMap::new();
    for label in kv_labels {
        let backend = match runtime_config.key_value_store(label, state_dir) {
            Some(config::KeyValueStore::Local { path }) => match files.get(&path) {
                Some(open) => StoreBackend::Local(open.clone()),
                None => {
                    let open = Arc::new(KeyValueBackend::open(&path)?);
                    files.insert(path, open.clone());
                    StoreBackend::Local(open)
                }
            },
            Some(config::KeyValueStore::Redis { url }) => StoreBackend::Redis(Arc::new(
                RedisStore::new(&url)
                    .with_context(|| format!("key-value store {label:?}: Invalid Redis URL"))?,
            )),
            None => continue,
        };
        kv.insert(label.to_owned(), backend);
    }
    let mut pools: HashMap<PathBuf, Arc<ConnectionPool>> = HashMap::new();
    let mut sqlite = HashMap::new();
    for label in sqlite_labels {
        let backend = match runtime_config.sqlite_database(label, state_dir) {
            Some(config::SqliteDatabase::Local { path }) => match pools.get(&path) {
                Some(open) => DatabaseBackend::Local(open.clone()),
                None => {
                    let open = ConnectionPool::open(&path)?;
                    pools.insert(path, open.clone());
                    DatabaseBackend::Local(open)
                }
            },
            Some(config::SqliteDatabase::Libsql { url, token }) => {
                DatabaseBackend::Libsql(Arc::new(LibsqlDatabase::new(&url, &token)))
            }
            None => continue,
        };
        sqlite.insert(label.to_owned(), backend);
    }
    Ok((kv, sqlite))
}

fn linker(engine: &Engine) -> anyhow::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    crate::bindings::fermyon::spin::key_value::add_to_linker::<_, key_value::KeyValue>(
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
/// `<state-dir>/logs/`, and copied to the host's stderr with `--follow-logs`.
#[derive(Clone)]
pub struct LogSink {
    file: Arc<File>,
    follow: bool,
    is_stderr: bool,
}

impl LogSink {
    fn open(path: &Path, follow: bool, is_stderr: bool) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open log file {}", path.display()))?;
        Ok(Self {
            file: Arc::new(file),
            follow,
            is_stderr,
        })
    }

    fn write_all(&self, bytes: &[u8]) -> std::io::Result<()> {
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
