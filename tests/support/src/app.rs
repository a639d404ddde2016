//! The harness of the end-to-end suites: the real `spin.toml` with the built `.wasm`
//! components, served by the project's host over real HTTP on an ephemeral port, with its
//! state in fresh SQLite files, or with `TEST_STORES=sqld-redis` on a fresh sqld and Redis of
//! its own ([`crate::stores`]). Fixtures are made through the API itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use std::sync::Arc;

use api_client::{Client, Session};
use reservations_store::share::{EDGE_FEED_REQUESTS_PER_TOKEN, EDGE_WRITE_SHARE};
use serde_json::{Value, json};
use spin_host::{Host, HostConfig, TimeDelta};

use crate::paths::workspace;
use crate::positions::cells_under_test;
use crate::scenario::ReservationSpec;
use crate::stores::{RemoteStores, RuntimeConfig, Sites, Sqld, Stores, stores_by_default};
use crate::temp::TempDir;

pub const OPERATOR_TOKEN: &str = "test-operator-token-0123456789abcdef";
/// The secret that keys the audit chain in every test app.
pub const AUDIT_KEY: &str = "test-audit-key-fedcba9876543210";

/// Makes sure every component of spin.toml is built (the test command builds them first;
/// this only covers a bare `cargo test`). spin.toml is read by the host's own parser.
pub fn ensure_components_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let manifest = spin_host::manifest::Manifest::load(&workspace().join("spin.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
        let missing = manifest
            .components
            .values()
            .any(|component| !component.source.is_file());
        if missing {
            let status = Command::new("bash")
                .arg(workspace().join("scripts/build-wasm"))
                .status()
                .expect("run scripts/build-wasm");
            assert!(status.success(), "building the components failed");
        }
    });
}

/// The app, running.
pub struct App {
    host: Host,
    /// What `host` was started with (another host of the same app starts with it too).
    config: HostConfig,
    /// Its own sqld and Redis, with `TEST_STORES=sqld-redis`.
    stores: Option<RemoteStores>,
    /// Its edge deployment, with `TEST_STORES=sqld-sites`: `host` serves site 1, and
    /// `other_sites` another replica of the app at site 1 and one at each other site.
    sites: Option<Sites>,
    other_sites: Vec<Host>,
    /// With `TEST_STORES=sqld-sites`, the app beside the primaries, where every site's
    /// writes run (its `home_url`).
    home: Option<Host>,
    /// With several sites, the session the app's clients share ([`Session`]).
    session: Option<Arc<Session>>,
    db_path: PathBuf,
    /// With several cells on local files (`TEST_CELLS`), the files of cells 1 … S-1.
    cell_paths: Vec<PathBuf>,
    state: TempDir,
    pub base: String,
}

/// The file of Spin's `default` database in the state directory.
const LOCAL_DATABASE: &str = "sqlite_db.db";

/// How many sites an app has with `TEST_STORES=sqld-sites`.
pub const SITES: usize = 2;

impl App {
    pub fn start() -> App {
        App::start_with(|config| config)
    }

    /// Starts with a tweaked host config (e.g. no operator token).
    pub fn start_with(tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let state = TempDir::new("state");
        match stores_by_default() {
            Stores::Local => App::start_in(state, None, tweak),
            Stores::SqldRedis => App::start_on_own_sqld(state, tweak),
            Stores::SqldSites => App::start_at_sites(state, tweak),
        }
    }

    /// Starts as [`App::start`] does, but on one database even where `TEST_STORES` asks for
    /// sites (then on a sqld of its own) or `TEST_CELLS` for cells (then in one local file):
    /// for tests that change the database file behind the app's back, which sqld's
    /// replication would not carry to a site, and that rewrite the whole trail.
    pub fn start_on_one_database() -> App {
        match stores_by_default() {
            Stores::SqldSites | Stores::SqldRedis => {
                let state = TempDir::new("state");
                let stores = RemoteStores::start_in_cells(&state.path().join("stores"), 1);
                let mut app = App::start_in(state, Some(stores.runtime_config()), |c| c);
                app.on_stores(&stores);
                app.stores = Some(stores);
                app
            }
            Stores::Local => App::start_on_local_files(),
        }
    }

    /// Starts on one local SQLite file whatever `TEST_STORES` and `TEST_CELLS` say: for
    /// tests that write to the database file behind the app's back, which a running sqld
    /// does not allow.
    pub fn start_on_local_files() -> App {
        App::start_on_local_files_with(|config| config)
    }

    /// [`App::start_on_local_files`] with a tweaked host config: for a test of the app's own
    /// settings, which a layout's harness would set otherwise (its `home_url`, say).
    pub fn start_on_local_files_with(tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        App::start_in_one_database(TempDir::new("state"), tweak)
    }

    /// Starts on local SQLite files, on the database `prepare` writes first at the path it is
    /// given (a database an earlier build left, say).
    pub fn start_on_database(prepare: impl FnOnce(&Path)) -> App {
        let state = TempDir::new("state");
        prepare(&state.path().join(LOCAL_DATABASE));
        App::start_in_one_database(state, |config| config)
    }

    /// On a sqld (one per cell, with `TEST_CELLS`) and a Redis of its own.
    fn start_on_own_sqld(state: TempDir, tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let stores = RemoteStores::start_in_cells(&state.path().join("stores"), cells_under_test());
        let mut app = App::start_in(state, Some(stores.runtime_config()), tweak);
        app.on_stores(&stores);
        app.stores = Some(stores);
        app
    }

    /// On `cells` sqld primaries and a Redis of its own, whatever `TEST_STORES` and
    /// `TEST_CELLS` say: for the suites about one cell's server failing.
    pub fn start_on_sqld_cells(cells: usize) -> App {
        let state = TempDir::new("state");
        let stores = RemoteStores::start_in_cells(&state.path().join("stores"), cells);
        let mut app = App::start_in(state, Some(stores.runtime_config()), |config| config);
        app.on_stores(&stores);
        app.stores = Some(stores);
        app
    }

    /// The sqld primary of cell `cell` (0 is the directory's), for an app on sqld of its own.
    pub fn cell_primary(&mut self, cell: usize) -> &mut Sqld {
        let stores = self.stores.as_mut().expect("an app on sqld of its own");
        match cell {
            0 => &mut stores.sqld,
            n => &mut stores.cells[n - 1],
        }
    }

    /// Reads the databases of `stores` behind the API; with cells, health first, as a
    /// deployment's readiness probe does.
    fn on_stores(&mut self, stores: &RemoteStores) {
        self.db_path = stores.sqld.data_path();
        self.cell_paths = stores.cells.iter().map(Sqld::data_path).collect();
        if !stores.cells.is_empty() {
            self.ready();
        }
    }

    /// Asks health once, as a deployment's readiness probe does before requests arrive: it
    /// brings every cell's schema up to date (an app configured to refuse is left to the test).
    fn ready(&self) {
        self.anonymous().without_contract().get("/v1/healthz");
    }

    /// Starts on `stores`, which the caller keeps (replicas share them).
    pub fn start_on(stores: &RemoteStores) -> App {
        let mut app = App::start_in(
            TempDir::new("state"),
            Some(stores.runtime_config()),
            |config| config,
        );
        app.on_stores(stores);
        app
    }

    /// Starts on `runtime_config` (a site of an edge deployment the caller keeps, say).
    pub fn start_with_runtime_config(runtime_config: &Path) -> App {
        App::start_in(TempDir::new("state"), Some(runtime_config), |config| config)
    }

    /// Starts on `runtime_config` at an edge site whose writes run at `home_url`.
    pub fn start_at_site(runtime_config: &Path, home_url: &str) -> App {
        App::start_in(TempDir::new("state"), Some(runtime_config), |config| {
            config.env("SPIN_VARIABLE_HOME_URL", home_url)
        })
    }

    /// The port the app listens on.
    pub fn port(&self) -> u16 {
        self.host
            .base_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    /// [`SITES`] sites on their own edge deployment ([`Sites`]): the home app beside the
    /// primaries (which migrates the schema, as a deployment's does), then two app replicas
    /// serve site 1 (sharing its read replica) and one each other site, all forwarding their
    /// writes to the home, and the app's clients share one session over the sites.
    fn start_at_sites(state: TempDir, tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let cells = cells_under_test();
        let sites = Sites::start_in_cells(
            &state.path().join("sites"),
            SITES,
            std::time::Duration::ZERO,
            cells,
        );
        let mut at_home = App::host_config(&state, Some(sites.primary_config()), tweak);
        if cells > 1 {
            at_home.manifest = cells_manifest(cells);
        }
        let home = Host::start(at_home.clone().state_dir(state.path().join("home")))
            .expect("the app starts at home");
        // The home migrates the schema; the sites' copies receive it. Health is asked until
        // it answers 200, as a readiness probe does (a 503 `database-busy` while a loaded sqld
        // is slow to migrate is asked again), or says the app is not configured (a test of an
        // unset secret), for at most a minute.
        let home_health = format!("{}/v1/healthz", home.base_url());
        crate::clock::until(
            "health answers at home",
            std::time::Duration::from_secs(60),
            || {
                let reply = crate::http::get(&home_health);
                reply.status == 200 || reply.text().contains("-unset\"")
            },
        );
        let config = at_home
            .env("SPIN_VARIABLE_HOME_URL", home.base_url())
            .runtime_config(sites.site_config(1));
        // A second app replica at site 1, on the same read replica, then one at each other
        // site.
        let others = std::iter::once(1)
            .chain(2..=SITES)
            .enumerate()
            .map(|(i, site)| {
                let dir = state.path().join(format!("host-{i}-site-{site}"));
                let config = config
                    .clone()
                    .state_dir(&dir)
                    .runtime_config(sites.site_config(site));
                Host::start(config).expect("the app starts at a site")
            })
            .collect::<Vec<_>>();
        let host = Host::start(config.clone()).expect("the app starts at a site");
        let base = host.base_url();
        let cell_paths = sites.cells.iter().map(|c| c.primary.data_path()).collect();
        let bases = std::iter::once(base.clone())
            .chain(others.iter().map(Host::base_url))
            .collect();
        App {
            host,
            config,
            stores: None,
            db_path: sites.primary.data_path(),
            sites: Some(sites),
            other_sites: others,
            home: Some(home),
            session: Some(Session::new(bases)),
            cell_paths,
            state,
            base,
        }
    }

    fn host_config(
        state: &TempDir,
        runtime_config: Option<&Path>,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> HostConfig {
        ensure_components_built();
        let mut config = HostConfig::new(workspace().join("spin.toml"))
            .state_dir(state.path())
            .env("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("SPIN_VARIABLE_AUDIT_KEY", AUDIT_KEY);
        if let Some(runtime_config) = runtime_config {
            // As at the edge: each org's write share and each token's feed requests, counted
            // in Redis.
            config = config
                .runtime_config(runtime_config)
                .env(
                    "SPIN_VARIABLE_ORG_WRITE_SHARE",
                    EDGE_WRITE_SHARE.to_string(),
                )
                .env(
                    "SPIN_VARIABLE_FEED_REQUESTS_PER_TOKEN",
                    EDGE_FEED_REQUESTS_PER_TOKEN.to_string(),
                );
        }
        let mut config = tweak(config);
        config.log_requests = false;
        config.print_banner = false;
        config
    }

    /// On local files: with `TEST_CELLS` > 1, each cell but the directory's in a file of its
    /// own beside it, through a runtime config and the manifest that grants the cells.
    fn start_in(
        state: TempDir,
        runtime_config: Option<&Path>,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> App {
        let cells = cells_under_test();
        if let Some(runtime_config) = runtime_config {
            return App::start_in_with_runtime_config(state, runtime_config, tweak);
        }
        if cells == 1 {
            return App::start_in_one_database(state, tweak);
        }
        App::start_in_cells(state, cells, tweak)
    }

    /// On `cells` local files whatever `TEST_CELLS` says: for the suites about cells.
    pub fn start_on_cells(cells: usize) -> App {
        App::start_in_cells(TempDir::new("state"), cells, |config| config)
    }

    /// The same app on the same state with `cells` cells, the files of them all given to
    /// `offline` first, while no host runs (an operator's procedure on the files).
    pub fn restarted_on_cells(self, cells: usize, offline: impl FnOnce(&[PathBuf])) -> App {
        let App {
            host,
            state,
            other_sites,
            home,
            ..
        } = self;
        host.shutdown();
        drop(other_sites);
        drop(home);
        let paths = local_cell_files(state.path(), cells);
        offline(&paths);
        App::start_in_cells(state, cells, |config| config)
    }

    fn start_in_cells(
        state: TempDir,
        cells: usize,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> App {
        let (runtime_config, cell_paths) = local_cells_runtime_config(state.path(), cells);
        let mut config = App::host_config(&state, None, tweak).runtime_config(&runtime_config);
        config.manifest = cells_manifest(cells);
        let mut app = App::started(state, config);
        app.cell_paths = cell_paths;
        app.ready();
        app
    }

    fn start_in_one_database(state: TempDir, tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let config = App::host_config(&state, None, tweak);
        App::started(state, config)
    }

    /// On the stores `runtime_config` names: when it names cells' databases, each cell on its
    /// label, through the manifest that grants them all.
    fn start_in_with_runtime_config(
        state: TempDir,
        runtime_config: &Path,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> App {
        let mut config = App::host_config(&state, Some(runtime_config), tweak);
        let cells = 1 + std::fs::read_to_string(runtime_config)
            .map(|text| text.matches("[sqlite_database.cell").count())
            .unwrap_or(0);
        if cells > 1 {
            config.manifest = cells_manifest(cells);
        }
        App::started(state, config)
    }

    fn started(state: TempDir, config: HostConfig) -> App {
        let host = Host::start(config.clone()).expect("the app starts");
        let base = host.base_url();
        App {
            host,
            config,
            stores: None,
            sites: None,
            other_sites: Vec::new(),
            home: None,
            session: None,
            db_path: state.path().join(LOCAL_DATABASE),
            cell_paths: Vec::new(),
            state,
            base,
        }
    }

    /// Another host of the same app on the same state and stores (a replica beside it).
    pub fn another_host(&self) -> Host {
        Host::start(self.config.clone()).expect("another host of the app starts")
    }

    /// The app's edge deployment, with `TEST_STORES=sqld-sites`.
    pub fn sites(&self) -> Option<&Sites> {
        self.sites.as_ref()
    }

    /// The address of each site's app (one without sites).
    pub fn site_bases(&self) -> Vec<String> {
        std::iter::once(self.base.clone())
            .chain(self.other_sites.iter().map(Host::base_url))
            .collect()
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// Every SQLite statement the app's components have run so far: at its host, and at
    /// the home where its writes run.
    pub fn sqlite_statements(&self) -> spin_host::StatementCounts {
        let here = self.host.sqlite_statements();
        match &self.home {
            Some(home) => here + home.sqlite_statements(),
            None => here,
        }
    }

    /// Every SQLite statement the app's components have run so far on the database labelled
    /// `label` (`default`, `cell1`, …), at its host and at its home.
    pub fn statements_on(&self, label: &str) -> u64 {
        self.host.sqlite_statements_of(label)
            + self
                .home
                .as_ref()
                .map_or(0, |home| home.sqlite_statements_of(label))
    }

    /// The file of the app's database: in the state directory, or sqld's. With several
    /// cells, the directory's.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// The files of every cell's database, the directory's first.
    pub fn database_paths(&self) -> Vec<&Path> {
        std::iter::once(self.db_path.as_path())
            .chain(self.cell_paths.iter().map(PathBuf::as_path))
            .collect()
    }

    /// The cells the app's market is partitioned over.
    pub fn cells(&self) -> reservations_store::cells::Cells {
        reservations_store::cells::Cells::new(self.cell_paths.len() + 1).expect("a count of cells")
    }

    /// An id of another node that lives in the same cell as `node_id`.
    pub fn node_id_beside(&self, node_id: &str) -> String {
        let cells = self.cells();
        (0..)
            .map(|n| format!("{node_id}-beside-{n}"))
            .find(|id| cells.home_of(id) == cells.home_of(node_id))
            .expect("an id in the same cell")
    }

    /// The database of the cell that holds `node_id`, opened directly, for a test that
    /// writes behind the app's back where the node's rows are.
    pub fn node_db(&self, node_id: &str) -> rusqlite::Connection {
        let cells = self.cells();
        let path = self.database_paths()[cells.home_of(node_id).index()];
        let connection = rusqlite::Connection::open(path).expect("open the node's database");
        connection
            .busy_timeout(std::time::Duration::from_secs(10))
            .expect("busy timeout");
        connection
    }

    /// Every key and value of the app's key-value store: its Redis (its own, or its edge
    /// deployment's), or Spin's local key-value file.
    pub fn key_value_dump(&self) -> Vec<String> {
        let stores = self.stores.as_ref().map(|stores| &stores.redis);
        let sites = self.sites.as_ref().map(|sites| &sites.redis);
        if let Some(redis) = stores.or(sites) {
            return redis.dump();
        }
        let path = self.state_dir().join("sqlite_key_value.db");
        if !path.exists() {
            return Vec::new();
        }
        let kv = rusqlite::Connection::open(&path).expect("open the key-value file");
        kv.busy_timeout(std::time::Duration::from_secs(10))
            .expect("busy timeout");
        let has_table = kv
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'spin_key_value'",
                [],
                |row| row.get::<_, i64>(0),
            )
            .expect("the key-value file's tables")
            > 0;
        if !has_table {
            return Vec::new();
        }
        let mut statement = kv
            .prepare("SELECT key, value FROM spin_key_value ORDER BY key")
            .expect("read the key-value file");
        statement
            .query_map([], |row| {
                let (key, value): (String, Vec<u8>) = (row.get(0)?, row.get(1)?);
                Ok(format!(
                    "key-value: {key} = {}",
                    String::from_utf8_lossy(&value)
                ))
            })
            .expect("the key-value rows")
            .collect::<Result<_, _>>()
            .expect("a key-value row")
    }

    /// The app's SQLite database, opened directly, to check state behind the API. With
    /// several cells on local files, every table reads as the rows of every cell (temporary
    /// views over the cells' files, the orgs each cell copies counted once), for reading
    /// only.
    pub fn db(&self) -> rusqlite::Connection {
        let connection = rusqlite::Connection::open(&self.db_path).expect("open db");
        connection
            .busy_timeout(std::time::Duration::from_secs(10))
            .expect("busy timeout");
        if !self.cell_paths.is_empty() {
            read_every_cell(&connection, &self.cell_paths);
        }
        connection
    }

    /// The database of cell `cell` alone (0: the directory's, the only one without cells),
    /// for reading only.
    pub fn cell_db(&self, cell: usize) -> rusqlite::Connection {
        let path = self.database_paths()[cell];
        let connection = rusqlite::Connection::open(path).expect("open a cell's db");
        connection
            .busy_timeout(std::time::Duration::from_secs(10))
            .expect("busy timeout");
        connection
    }

    /// The places of waiting feed polls `key_id` holds now.
    pub fn feed_waits_of(&self, key_id: &str) -> i64 {
        self.db()
            .query_row(
                "SELECT COUNT(*) FROM feed_waits WHERE key_id = ?1",
                [key_id],
                |r| r.get(0),
            )
            .expect("count the key's places")
    }

    /// Moves the components' clock `seconds` from the real one (never sleep for a term).
    pub fn set_clock_offset_secs(&self, seconds: i64) {
        for host in self.hosts() {
            host.set_clock_offset(TimeDelta::seconds(seconds));
        }
    }

    fn hosts(&self) -> impl Iterator<Item = &Host> {
        std::iter::once(&self.host)
            .chain(&self.other_sites)
            .chain(&self.home)
    }

    /// The app beside the primaries that runs the sites' writes, with
    /// `TEST_STORES=sqld-sites`.
    pub fn home(&self) -> Option<&Host> {
        self.home.as_ref()
    }

    /// Stops the components' clock at `at` (RFC 3339), to look at a boundary exactly; the
    /// next `set_clock_offset_secs` lets it run again.
    pub fn freeze_clock_at(&self, at: &str) {
        let at = chrono::DateTime::parse_from_rfc3339(at)
            .unwrap_or_else(|e| panic!("{at}: {e}"))
            .with_timezone(&chrono::Utc);
        for host in self.hosts() {
            host.freeze_clock_at(at);
        }
    }

    pub fn operator(&self) -> Client {
        self.client_with(Some(OPERATOR_TOKEN.to_owned()))
    }

    pub fn anonymous(&self) -> Client {
        self.client_with(None)
    }

    pub fn client(&self, token: &str) -> Client {
        self.client_with(Some(token.to_owned()))
    }

    fn client_with(&self, token: Option<String>) -> Client {
        match &self.session {
            Some(session) => Client::in_session(session, token),
            None => Client::new(&self.base, token),
        }
    }

    // ---------------------------------------------------------------- fixtures

    pub fn org(&self, id: &str) {
        self.operator()
            .post(
                "/v1/orgs",
                &json!({ "id": id, "name": format!("Org {id}") }),
            )
            .expect_status(201);
    }

    /// A key of `org` with `role` (and optionally an explicit permission list).
    pub fn key(&self, org: &str, role: &str, permissions: Option<&[&str]>) -> Client {
        let mut body = json!({ "name": format!("{role} key"), "role": role });
        if let Some(list) = permissions {
            body["permissions"] = json!(list);
        }
        let created = self
            .operator()
            .post(&format!("/v1/orgs/{org}/keys"), &body)
            .expect_status(201)
            .json();
        self.client(created["token"].as_str().expect("token"))
    }

    pub fn node(&self, id: &str, owner: &str, units: &[&str]) -> Value {
        self.operator()
            .put(
                &format!("/v1/nodes/{id}"),
                &json!({ "ownerOrgId": owner, "unitIds": units }),
            )
            .expect_status(201)
            .json()
    }

    /// An active, open-ended reservation (started an hour ago) made by the operator.
    pub fn reservation(
        &self,
        node: &str,
        units: &[&str],
        audience: &[&str],
        managers: &[&str],
    ) -> Value {
        self.make_reservation(
            &ReservationSpec::on(node, units)
                .audience(audience)
                .managers(managers),
        )
    }

    /// The reservation `spec` describes, made by the operator.
    pub fn make_reservation(&self, spec: &ReservationSpec) -> Value {
        spec.make_with(&self.operator()).1
    }
}

/// The key id of a client's `gpr.<keyId>.<secret>` token.
pub fn key_id(client: &Client) -> String {
    let token = client.token().expect("a token");
    token
        .split('.')
        .nth(1)
        .expect("gpr.<keyId>.<secret>")
        .to_owned()
}

/// The app's manifest for `cells` cells: the copy `scripts/cells-manifest` writes, once per
/// run and count, under target/.
/// The local file of each of `cells` cells of an app on `state`, the directory's first
/// (Spin's `default` database) and then `cell<n>.db`.
pub fn local_cell_files(state: &Path, cells: usize) -> Vec<PathBuf> {
    std::iter::once(state.join(LOCAL_DATABASE))
        .chain((1..cells).map(|n| state.join(format!("cell{n}.db"))))
        .collect()
}

/// A runtime config in `state` that puts cells 1 … `cells`-1 in local files beside the
/// directory's (`cell<n>.db`): its path, and theirs.
fn local_cells_runtime_config(state: &Path, cells: usize) -> (PathBuf, Vec<PathBuf>) {
    let cell_paths = local_cell_files(state, cells).split_off(1);
    let runtime_config = state.join("cells-runtime-config.toml");
    cell_paths
        .iter()
        .enumerate()
        .fold(RuntimeConfig::default(), |config, (i, path)| {
            config.file_database(&format!("cell{}", i + 1), path)
        })
        .write(&runtime_config);
    (runtime_config, cell_paths)
}

/// What a `spin-host` process on `state` is started with for the market in `TEST_CELLS`
/// cells, each a local file in `state`: the manifest that grants them and the runtime config
/// that maps them (nothing with one cell).
pub fn local_cells_host_args(state: &Path) -> Vec<std::ffi::OsString> {
    let cells = crate::positions::cells_under_test();
    if cells == 1 {
        return Vec::new();
    }
    let (runtime_config, _) = local_cells_runtime_config(state, cells);
    vec![
        "--manifest".into(),
        cells_manifest(cells).into(),
        "--runtime-config-file".into(),
        runtime_config.into(),
    ]
}

/// The manifest of the market in `cells` cells (`scripts/cells-manifest`), written once per
/// test process.
pub fn cells_manifest(cells: usize) -> PathBuf {
    static WRITTEN: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    let path = workspace()
        .join("target")
        .join("cells-manifests")
        .join(cells.to_string())
        .join("spin.toml");
    let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    if !written.contains(&cells) {
        let status = Command::new("python3")
            .arg(workspace().join("scripts/cells-manifest"))
            .arg(cells.to_string())
            .arg(&path)
            .status()
            .expect("run scripts/cells-manifest");
        assert!(status.success(), "writing the cells' manifest failed");
        written.push(cells);
    }
    path
}

/// Makes every table of `connection`'s database read as the union of it and the same table
/// in each of `cells` (attached), through temporary views, which name resolution finds first.
fn read_every_cell(connection: &rusqlite::Connection, cells: &[PathBuf]) {
    let tables_of = |schema: &str| -> Vec<String> {
        let sql = format!(
            "SELECT name FROM {schema}.sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' ORDER BY name"
        );
        let mut statement = connection.prepare(&sql).expect("list tables");
        statement
            .query_map([], |row| row.get(0))
            .expect("tables")
            .map(|name| name.expect("a name"))
            .collect()
    };
    for (n, path) in cells.iter().enumerate() {
        connection
            .execute(
                "ATTACH DATABASE ?1 AS ?2",
                (path.to_str().expect("a path"), format!("cell{}", n + 1)),
            )
            .expect("attach a cell");
    }
    let cell_tables: Vec<Vec<String>> = (1..=cells.len())
        .map(|n| tables_of(&format!("cell{n}")))
        .collect();
    for table in tables_of("main") {
        let mut parts = vec![format!("SELECT * FROM main.\"{table}\"")];
        for (n, tables) in (1..).zip(&cell_tables) {
            if tables.contains(&table) {
                parts.push(format!("SELECT * FROM cell{n}.\"{table}\""));
            }
        }
        // Each cell copies the orgs its rows name: the same row, counted once.
        let union = if table == "orgs" {
            " UNION "
        } else {
            " UNION ALL "
        };
        connection
            .execute_batch(&format!(
                "CREATE TEMP VIEW \"{table}\" AS {}",
                parts.join(union)
            ))
            .expect("a view over every cell");
    }
}
