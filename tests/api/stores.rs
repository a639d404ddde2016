//! Real shared stores for the end-to-end suites: a libSQL server (sqld) and a Redis server,
//! started on free loopback ports with their data in a test's own directory, killed when
//! dropped. `scripts/stores install` puts sqld in `target/stores/bin/sqld` (override:
//! `SQLD_BIN`) and Redis's `redis-server` on the PATH (override: `REDIS_SERVER_BIN`); a bare
//! `cargo test` runs that script once if either is missing.
//!
//! `TEST_STORES=sqld-redis` runs the suites that use [`crate::support::App`] on these stores
//! (each app its own sqld and Redis) instead of local files; the replica suites always use
//! them.

#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::workspace;

/// Whether `TEST_STORES` asks for sqld and Redis instead of local files.
pub fn remote_by_default() -> bool {
    match std::env::var("TEST_STORES").as_deref() {
        Ok("sqld-redis") => true,
        Ok("local") | Ok("") | Err(_) => false,
        Ok(other) => panic!("TEST_STORES={other}: expected `local` or `sqld-redis`"),
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The sqld and redis-server binaries, installed by `scripts/stores install` if missing.
fn binaries() -> &'static (PathBuf, PathBuf) {
    static BINARIES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let sqld = std::env::var_os("SQLD_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("stores/bin/sqld"));
        let redis = std::env::var_os("REDIS_SERVER_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let redis_found = || {
            Command::new(&redis)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !sqld.is_file() || !redis_found() {
            let status = Command::new("bash")
                .arg(workspace().join("scripts/stores"))
                .arg("install")
                .status()
                .expect("run scripts/stores install");
            assert!(status.success(), "scripts/stores install failed");
        }
        assert!(sqld.is_file(), "{} missing", sqld.display());
        assert!(redis_found(), "{} does not run", redis.display());
        (sqld, redis)
    })
}

/// sqld's `--checkpoint-interval-s`, as `scripts/stores` starts it (keep the two equal). With
/// the flag sqld checkpoints its WAL on a timer instead of after the commit that fills it,
/// which takes the after-commit checkpoint out of the cycle that stalls 0.24.32's writers.
/// The WAL grows for a whole interval (about 3.6 MB/s at 770 single-row writes/s), so the
/// interval is short: write latency measured the same at 5, 30 and 60 s.
pub const SQLD_CHECKPOINT_INTERVAL_S: u32 = 5;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Waits until `port` accepts connections, or panics with the server's log.
fn wait_until_listening(port: u16, what: &str, log: &Path, child: &mut Child) {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{what} did not listen on {port}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A sqld (libSQL server) with its data in `dir`.
pub struct Sqld {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    /// How many times it was killed and started again.
    pub restarts: usize,
}

impl Sqld {
    pub fn start(dir: &Path) -> Sqld {
        std::fs::create_dir_all(dir).expect("sqld dir");
        let mut sqld = Sqld {
            child: None,
            dir: dir.to_owned(),
            port: free_port(),
            restarts: 0,
        };
        sqld.spawn();
        sqld
    }

    fn spawn(&mut self) {
        let log_path = self.dir.join("sqld.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("sqld log");
        let mut child = Command::new(&binaries().0)
            .arg("--db-path")
            .arg(self.dir.join("data.sqld"))
            .arg("--http-listen-addr")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(["--no-welcome", "--disable-metrics"])
            .arg("--checkpoint-interval-s")
            .arg(SQLD_CHECKPOINT_INTERVAL_S.to_string())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn sqld");
        wait_until_listening(self.port, "sqld", &log_path, &mut child);
        self.child = Some(child);
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The database file behind the `default` namespace, for checks behind the API (sqld
    /// keeps it in SQLite's WAL mode: another connection reads and writes it safely).
    pub fn data_path(&self) -> PathBuf {
        self.dir.join("data.sqld/dbs/default/data")
    }

    /// Kills it (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "sqld is running");
        self.spawn();
        self.restarts += 1;
    }
}

impl Drop for Sqld {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis server with its data in `dir` (no snapshots: the tests never restart it).
pub struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    pub fn start(dir: &Path) -> Redis {
        std::fs::create_dir_all(dir).expect("redis dir");
        let port = free_port();
        let log_path = dir.join("redis.log");
        let log = std::fs::File::create(&log_path).expect("redis log");
        let mut child = Command::new(&binaries().1)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn redis-server");
        wait_until_listening(port, "redis-server", &log_path, &mut child);
        Redis { child, port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to redis")
    }

    /// Every key and value, sorted, one line each (values as lossy text).
    pub fn dump(&self) -> Vec<String> {
        let mut connection = self.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut connection)
            .expect("KEYS");
        let mut lines: Vec<String> = keys
            .into_iter()
            .map(|key| {
                let value: Vec<u8> = redis::cmd("GET")
                    .arg(&key)
                    .query(&mut connection)
                    .expect("GET");
                format!("redis: {key} = {}", String::from_utf8_lossy(&value))
            })
            .collect();
        lines.sort();
        lines
    }

    /// How many keys it holds.
    pub fn key_count(&self) -> usize {
        redis::cmd("DBSIZE")
            .query(&mut self.connection())
            .expect("DBSIZE")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sqld and one Redis, and the runtime config that puts the app's `default` database
/// and key-value store on them.
pub struct RemoteStores {
    pub sqld: Sqld,
    pub redis: Redis,
    runtime_config: PathBuf,
}

impl RemoteStores {
    pub fn start(dir: &Path) -> RemoteStores {
        let sqld = Sqld::start(&dir.join("sqld"));
        let redis = Redis::start(&dir.join("redis"));
        let runtime_config = dir.join("runtime-config.toml");
        let mut file = std::fs::File::create(&runtime_config).expect("runtime config");
        write!(
            file,
            "[sqlite_database.default]\ntype = \"libsql\"\nurl = \"{}\"\ntoken = \"\"\n\n\
             [key_value_store.default]\ntype = \"redis\"\nurl = \"{}\"\n",
            sqld.url(),
            redis.url()
        )
        .expect("write the runtime config");
        RemoteStores {
            sqld,
            redis,
            runtime_config,
        }
    }

    pub fn runtime_config(&self) -> &Path {
        &self.runtime_config
    }
}
