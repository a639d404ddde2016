//! The harness of the end-to-end suites: the real `spin.toml` with the built `.wasm`
//! components, served by the project's host over real HTTP on an ephemeral port, with its
//! state in fresh SQLite files, or with `TEST_STORES=sqld-redis` on a fresh sqld and Redis of
//! its own ([`crate::stores`]). Fixtures are made through the API itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use api_client::Client;
use serde_json::{Value, json};
use spin_host::{Host, HostConfig, TimeDelta};

use crate::paths::workspace;
use crate::scenario::ReservationSpec;
use crate::stores::{RemoteStores, remote_by_default};
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
    /// Its own sqld and Redis, with `TEST_STORES=sqld-redis`.
    stores: Option<RemoteStores>,
    db_path: PathBuf,
    state: TempDir,
    pub base: String,
}

/// The file of Spin's `default` database in the state directory.
const LOCAL_DATABASE: &str = "sqlite_db.db";

impl App {
    pub fn start() -> App {
        App::start_with(|config| config)
    }

    /// Starts with a tweaked host config (e.g. no operator token).
    pub fn start_with(tweak: impl FnOnce(HostConfig) -> HostConfig) -> App {
        let state = TempDir::new("state");
        let stores = remote_by_default().then(|| RemoteStores::start(&state.path().join("stores")));
        let mut app = App::start_in(state, stores.as_ref(), tweak);
        app.stores = stores;
        app
    }

    /// Starts on local SQLite files whatever `TEST_STORES` says: for tests that write to the
    /// database file behind the app's back, which a running sqld does not allow.
    pub fn start_on_local_files() -> App {
        App::start_in(TempDir::new("state"), None, |config| config)
    }

    /// Starts on local SQLite files, on the database `prepare` writes first at the path it is
    /// given (a database an earlier build left, say).
    pub fn start_on_database(prepare: impl FnOnce(&Path)) -> App {
        let state = TempDir::new("state");
        prepare(&state.path().join(LOCAL_DATABASE));
        App::start_in(state, None, |config| config)
    }

    /// Starts on `stores`, which the caller keeps (replicas share them).
    pub fn start_on(stores: &RemoteStores) -> App {
        App::start_in(TempDir::new("state"), Some(stores), |config| config)
    }

    fn start_in(
        state: TempDir,
        stores: Option<&RemoteStores>,
        tweak: impl FnOnce(HostConfig) -> HostConfig,
    ) -> App {
        ensure_components_built();
        let mut config = HostConfig::new(workspace().join("spin.toml"))
            .state_dir(state.path())
            .env("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("SPIN_VARIABLE_AUDIT_KEY", AUDIT_KEY);
        let db_path = match stores {
            Some(stores) => {
                config = config.runtime_config(stores.runtime_config());
                stores.sqld.data_path()
            }
            None => state.path().join(LOCAL_DATABASE),
        };
        let mut config = tweak(config);
        config.log_requests = false;
        config.print_banner = false;
        let host = Host::start(config).expect("the app starts");
        let base = host.base_url();
        App {
            host,
            stores: None,
            db_path,
            state,
            base,
        }
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// Every SQLite statement the app's components have run so far.
    pub fn sqlite_statements(&self) -> spin_host::StatementCounts {
        self.host.sqlite_statements()
    }

    /// The file of the app's database: in the state directory, or sqld's.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Every key and value of the app's own Redis, when it has one.
    pub fn redis_dump(&self) -> Option<Vec<String>> {
        self.stores.as_ref().map(|stores| stores.redis.dump())
    }

    /// The app's SQLite database, opened directly, to check state behind the API.
    pub fn db(&self) -> rusqlite::Connection {
        let connection = rusqlite::Connection::open(&self.db_path).expect("open db");
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
        self.host.set_clock_offset(TimeDelta::seconds(seconds));
    }

    /// Stops the components' clock at `at` (RFC 3339), to look at a boundary exactly; the
    /// next `set_clock_offset_secs` lets it run again.
    pub fn freeze_clock_at(&self, at: &str) {
        let at = chrono::DateTime::parse_from_rfc3339(at)
            .unwrap_or_else(|e| panic!("{at}: {e}"))
            .with_timezone(&chrono::Utc);
        self.host.freeze_clock_at(at);
    }

    pub fn operator(&self) -> Client {
        Client::new(&self.base, Some(OPERATOR_TOKEN.to_owned()))
    }

    pub fn anonymous(&self) -> Client {
        Client::new(&self.base, None)
    }

    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.base, Some(token.to_owned()))
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
