//! Real shared stores for the end-to-end suites: a libSQL server (sqld) and a Redis server,
//! started on free loopback ports with their data in a test's own directory, killed when
//! dropped. `scripts/stores install` puts sqld in `target/stores/bin/sqld` (override:
//! `SQLD_BIN`) and Redis's `redis-server` on the PATH (override: `REDIS_SERVER_BIN`); a bare
//! `cargo test` runs that script once if either is missing.
//!
//! `TEST_STORES=sqld-redis` runs the suites that use [`crate::App`] on these stores
//! (each app its own sqld and Redis) instead of local files, and `TEST_STORES=sqld-sites` on
//! an edge deployment of their own ([`Sites`]); the replica suites always use sqld.
//!
//! Every sqld runs with a watchdog ([`Watchdog`]): sqld 0.24.32 can stall for good with
//! writers queued for its write lock, and a suite on a stalled sqld would otherwise hang
//! until CI's time runs out, with nothing to show why.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::link::Link;
use crate::paths::{target_dir, workspace};

/// What `TEST_STORES` asks the suites' apps to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// SQLite files in the app's state directory (the default).
    Local,
    /// A sqld and a Redis of the app's own (`sqld-redis`).
    SqldRedis,
    /// An edge deployment of the app's own (`sqld-sites`): a primary, a read replica per
    /// site, a Redis, and the app at each site ([`Sites`]).
    SqldSites,
}

pub fn stores_by_default() -> Stores {
    match std::env::var("TEST_STORES").as_deref() {
        Ok("local") | Ok("") | Err(_) => Stores::Local,
        Ok("sqld-redis") => Stores::SqldRedis,
        Ok("sqld-sites") => Stores::SqldSites,
        Ok(other) => {
            panic!("TEST_STORES={other}: expected `local`, `sqld-redis` or `sqld-sites`")
        }
    }
}

/// Whether `TEST_STORES` puts the apps on sqld (alone or at sites) instead of local files.
pub fn remote_by_default() -> bool {
    stores_by_default() != Stores::Local
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

/// sqld's `--max-log-size` in megabytes, as `scripts/stores` starts it (keep the two equal):
/// the replication log is compacted ten times less often than by default. sqld 0.24.32's
/// compactor falls behind a sustained burst of writes and, once eight logs wait for it,
/// blocks the commit that holds the write lock; at 200 MB the 20-minute soak of a hot node
/// stalled after 11 minutes with ten logs waiting, at 2 000 MB it ran its 20 minutes.
pub const SQLD_MAX_LOG_SIZE_MB: u32 = 2000;

/// A site's read replica's `--max-concurrent-connections`, as `scripts/stores` and
/// deploy/sites.yaml set it (keep them equal). At a replica each statement after a request's
/// first opens a connection of its own, so 32 writers at a site need more than sqld's
/// default 128 at once: past it the replica refuses a connection after waiting (429,
/// "Timed out while opening database connection"), which the app retries, and writes' p99
/// at 32 writers was 6–8 s instead of 1.4–1.8 s.
pub const SQLD_REPLICA_MAX_CONNECTIONS: u32 = 512;

/// The pids of the store servers the harness runs, so that a stall, which aborts the test
/// process, can end them first rather than leave them running.
static STORE_PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn register_pid(pid: u32) {
    STORE_PIDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(pid);
}

fn unregister_pid(pid: u32) {
    STORE_PIDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
}

/// The ports handed to the harness's servers in this process: a server's port stays its own
/// while it is down (sqld is restarted on the same port), so it is never handed out again.
static PORTS_HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A loopback port the system has free now and this process never handed out. The listener
/// that found it is closed before the server binds the port: another program may take it in
/// between, which the server's start notices (see [`Sqld::spawn`]).
fn free_port() -> u16 {
    let mut handed_out = PORTS_HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Waits until `port` accepts connections, or panics with the server's log.
fn wait_until_listening(port: u16, what: &str, log: &Path, child: &mut Child) {
    if let Err(reason) = try_until_listening(port, what, log, child) {
        panic!("{reason}");
    }
}

/// Waits until `port` accepts connections; why not, with the server's log, when the server
/// exited first or never listened.
fn try_until_listening(port: u16, what: &str, log: &Path, child: &mut Child) -> Result<(), String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "{what} exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{what} did not listen on {port}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    ))
}

/// A sqld (libSQL server) with its data in `dir`; the one that takes writes is watched for
/// stalls while it runs.
pub struct Sqld {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    /// What makes it a primary (`--grpc-listen-addr`) or a read replica
    /// (`--primary-grpc-url`); nothing for a lone server.
    role_args: Vec<String>,
    grpc_port: Option<u16>,
    watchdog: Option<Watchdog>,
    /// How many times it was killed and started again.
    pub restarts: usize,
}

impl Sqld {
    /// A lone server, as an app's own.
    pub fn start(dir: &Path) -> Sqld {
        Sqld::start_as(dir, Vec::new(), None, true)
    }

    /// The primary of an edge deployment: it also listens for its read replicas' gRPC.
    pub fn start_primary(dir: &Path) -> Sqld {
        let grpc_port = free_port();
        let args = vec![
            "--grpc-listen-addr".to_owned(),
            format!("127.0.0.1:{grpc_port}"),
        ];
        Sqld::start_as(dir, args, Some(grpc_port), true)
    }

    /// A read replica of the primary whose gRPC is at `primary_grpc` (`http://host:port`):
    /// it serves reads from its own copy and forwards writes there.
    pub fn start_replica(dir: &Path, primary_grpc: &str) -> Sqld {
        let args = vec![
            "--primary-grpc-url".to_owned(),
            primary_grpc.to_owned(),
            "--max-concurrent-connections".to_owned(),
            SQLD_REPLICA_MAX_CONNECTIONS.to_string(),
        ];
        Sqld::start_as(dir, args, None, false)
    }

    fn start_as(dir: &Path, role_args: Vec<String>, grpc_port: Option<u16>, watched: bool) -> Sqld {
        std::fs::create_dir_all(dir).expect("sqld dir");
        let port = free_port();
        let mut sqld = Sqld {
            child: None,
            dir: dir.to_owned(),
            port,
            role_args,
            grpc_port,
            watchdog: watched.then(|| Watchdog::start(port, dir)),
            restarts: 0,
        };
        sqld.spawn();
        sqld
    }

    /// The port a primary listens on for its replicas.
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc_port
    }

    /// Starts sqld on its port. Should it exit first (another program held the port for a
    /// moment, as a search for a free port does), it is started again, a few times.
    fn spawn(&mut self) {
        let log_path = self.dir.join("sqld.log");
        let mut failures = Vec::new();
        for _ in 0..10 {
            let mut child = self.spawn_once(&log_path);
            match try_until_listening(self.port, "sqld", &log_path, &mut child) {
                Ok(()) => {
                    if let Some(watchdog) = &self.watchdog {
                        watchdog.watch(child.id());
                    }
                    self.child = Some(child);
                    return;
                }
                Err(reason) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    unregister_pid(child.id());
                    failures.push(reason);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        panic!(
            "sqld never listened on {}: {}",
            self.port,
            failures.join("\n")
        );
    }

    fn spawn_once(&self, log_path: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .expect("sqld log");
        let child = Command::new(&binaries().0)
            .arg("--db-path")
            .arg(self.dir.join("data.sqld"))
            .arg("--http-listen-addr")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(["--no-welcome", "--disable-metrics"])
            .arg("--checkpoint-interval-s")
            .arg(SQLD_CHECKPOINT_INTERVAL_S.to_string())
            .arg("--max-log-size")
            .arg(SQLD_MAX_LOG_SIZE_MB.to_string())
            .args(&self.role_args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn sqld");
        register_pid(child.id());
        child
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
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

    /// How far its copy of the database has come, read from its file directly (not through
    /// sqld, which may answer a replica's read at the primary): the position of its newest
    /// audit event, as the app counts positions (0 before the first).
    pub fn position(&self) -> i64 {
        self.read_position().expect("the position of sqld's copy")
    }

    /// [`Sqld::position`], or `None` while its copy cannot say (the schema not there yet).
    pub fn position_if_any(&self) -> Option<i64> {
        self.read_position().ok()
    }

    fn read_position(&self) -> rusqlite::Result<i64> {
        let db = rusqlite::Connection::open(self.data_path())?;
        db.busy_timeout(Duration::from_secs(10))?;
        db.query_row("SELECT COALESCE(MAX(seq), 0) FROM audit_events", [], |r| {
            r.get(0)
        })
    }

    /// Stops it with SIGSTOP (it keeps its sockets and answers nothing), as a stall does.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args(["-STOP", &child.id().to_string()])
                .status();
        }
    }

    /// Stalls it on purpose: the watchdog stands down, then SIGSTOP as in [`Sqld::freeze`].
    /// [`Sqld::kill`] and [`Sqld::start_again`] end the stall, as its liveness probe's
    /// restart does.
    pub fn stall(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.pause();
        }
        self.freeze();
    }

    /// Its liveness probe, as deploy/sqld.yaml runs it: whether a write through its HTTP API
    /// completes `within` (the watchdog's write, which leaves nothing behind).
    pub fn completes_a_write(&self, within: Duration) -> bool {
        probe(self.port, within) == Ok(Probe::Written)
    }

    /// Whether the liveness command of deploy/sqld.yaml itself passes against it: the
    /// manifest's `exec` command, run as Kubernetes would (its own `timeout` set to `within`,
    /// the port this sqld listens on, the probe token empty: the test's sqld takes no JWT).
    pub fn passes_its_manifest_liveness_probe(&self, within: Duration) -> bool {
        let mut command = manifest_liveness_command();
        assert_eq!(
            command[0], "timeout",
            "the manifest's probe bounds itself: {command:?}"
        );
        command[1] = within.as_secs().max(1).to_string();
        let script = command.last_mut().expect("the probe's script");
        assert!(script.contains("/dev/tcp/127.0.0.1/8080"), "{script}");
        *script = script.replace(
            "/dev/tcp/127.0.0.1/8080",
            &format!("/dev/tcp/127.0.0.1/{}", self.port),
        );
        Command::new(&command[0])
            .args(&command[1..])
            .env("SQLD_PROBE_TOKEN", "")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Kills it (SIGKILL) and waits for it to be gone. The watchdog stands down first: a
    /// sqld that is down on purpose has not stalled.
    pub fn kill(&mut self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.pause();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            unregister_pid(child.id());
        }
    }

    /// Starts it again on the same port and data; the watchdog resumes once it listens.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "sqld is running");
        self.spawn();
        self.restarts += 1;
    }
}

impl Drop for Sqld {
    fn drop(&mut self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.stop();
        }
        self.kill();
    }
}

/// How long sqld may go without completing a write while one is pending before the
/// watchdog calls it a stall. Writes on these loopback servers take milliseconds, and sqld
/// takes the write lock away from a transaction that has held it for 5 s, so a healthy
/// sqld never comes near this.
const STALL_AFTER: Duration = Duration::from_secs(15);

/// How often the watchdog writes.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// A background thread that writes to one sqld every [`PROBE_EVERY`] and, when no write
/// has completed for [`STALL_AFTER`] while its own was pending, prints sqld's thread stacks
/// and aborts the test process: the stalled sqld would never recover, and a panic in a
/// thread of its own would not fail the test that waits on it.
///
/// Its write is `BEGIN IMMEDIATE` then `ROLLBACK` in one request: it queues for sqld's write
/// lock behind every other writer, as any write does, and leaves nothing behind, since the
/// suites compare every table of the database (and `user_version`) before and after.
struct Watchdog {
    state: Arc<WatchState>,
}

struct WatchState {
    port: u16,
    dir: PathBuf,
    /// sqld's pid while it runs and is watched; 0 while the harness has it down.
    pid: AtomicU32,
    /// Bumped whenever `pid` changes, so that a probe that straddled a kill or a restart is
    /// not counted against the new process.
    epoch: AtomicU64,
    stopped: AtomicBool,
}

impl Watchdog {
    fn start(port: u16, dir: &Path) -> Watchdog {
        let state = Arc::new(WatchState {
            port,
            dir: dir.to_owned(),
            pid: AtomicU32::new(0),
            epoch: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let watched = state.clone();
        std::thread::Builder::new()
            .name(format!("sqld-watchdog-{port}"))
            .spawn(move || watch(&watched))
            .expect("start the sqld watchdog");
        Watchdog { state }
    }

    fn watch(&self, pid: u32) {
        self.state.pid.store(pid, Ordering::SeqCst);
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
    }

    fn pause(&self) {
        self.watch(0);
    }

    fn stop(&self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.pause();
    }
}

fn watch(state: &WatchState) {
    let mut epoch = state.epoch.load(Ordering::SeqCst);
    let mut last_write = Instant::now();
    let mut reported_exit = false;
    loop {
        std::thread::sleep(PROBE_EVERY);
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let now_epoch = state.epoch.load(Ordering::SeqCst);
        let pid = state.pid.load(Ordering::SeqCst);
        if now_epoch != epoch || pid == 0 {
            epoch = now_epoch;
            last_write = Instant::now();
            reported_exit = false;
            continue;
        }
        let result = probe(state.port, STALL_AFTER);
        if state.stopped.load(Ordering::SeqCst) || state.epoch.load(Ordering::SeqCst) != epoch {
            continue;
        }
        match result {
            // Written, or refused at once as busy: sqld answers, so it is not stalled (a
            // flood of writers keeps the lock busy without stalling anything).
            Ok(_) => last_write = Instant::now(),
            Err(_) if !is_running(pid) => {
                // A sqld that died is no stall: the suite fails on its own requests.
                if !reported_exit {
                    let _ = writeln!(
                        std::io::stderr(),
                        "sqld watchdog: sqld (pid {pid}, port {}) exited unexpectedly; see {}",
                        state.port,
                        state.dir.join("sqld.log").display()
                    );
                    reported_exit = true;
                }
            }
            Err(error) if last_write.elapsed() >= STALL_AFTER => {
                stalled(state, pid, last_write.elapsed(), &error)
            }
            Err(_) => {}
        }
    }
}

/// What sqld did with a probe's write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Written,
    /// Refused with an answer (e.g. the lock busy under a flood of writers).
    Answered(String),
}

/// One write through sqld's HTTP API, given `within` to complete: `Err` when sqld gave no
/// answer in time.
fn probe(port: u16, within: Duration) -> Result<Probe, String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&address, within).map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_read_timeout(Some(within));
    let _ = stream.set_write_timeout(Some(within));
    let body = r#"{"statements":["BEGIN IMMEDIATE","ROLLBACK"]}"#;
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("no answer in {:.1} s", within.as_secs_f64())
            }
            _ => format!("no answer: {e}"),
        })?;
    classify(&response).ok_or_else(|| "an answer that is not HTTP".to_owned())
}

/// The `livenessProbe.exec.command` of the sqld primary in deploy/sqld.yaml, read from the
/// manifest's text: each `- ` item of the list, a `|` block as its lines.
pub fn manifest_liveness_command() -> Vec<String> {
    let manifest =
        std::fs::read_to_string(workspace().join("deploy/sqld.yaml")).expect("deploy/sqld.yaml");
    let lines: Vec<&str> = manifest.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start().len();
    let probe = lines
        .iter()
        .position(|line| line.trim() == "livenessProbe:")
        .expect("a liveness probe");
    let exec = probe
        + lines[probe..]
            .iter()
            .position(|line| line.trim() == "command:")
            .expect("its exec command");
    let items_at = indent(lines[exec + 1]);
    let mut command = Vec::new();
    let mut i = exec + 1;
    while i < lines.len() && indent(lines[i]) == items_at && lines[i].trim_start().starts_with("- ")
    {
        let item = lines[i].trim_start()[2..].trim();
        i += 1;
        if item == "|" {
            let block: Vec<&str> = lines[i..]
                .iter()
                .take_while(|line| line.trim().is_empty() || indent(line) > items_at)
                .copied()
                .collect();
            i += block.len();
            let margin = block
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| indent(l))
                .min()
                .unwrap_or(0);
            let text: Vec<&str> = block
                .iter()
                .map(|l| l.get(margin..).unwrap_or(""))
                .collect();
            command.push(format!("{}\n", text.join("\n").trim_end()));
        } else {
            command.push(item.trim_matches('"').to_owned());
        }
    }
    command
}

/// What an HTTP response of sqld to the probe says: `None` if it is not one.
pub fn classify(response: &str) -> Option<Probe> {
    let status = response.lines().next()?;
    let code = status.split(' ').nth(1)?;
    if !status.starts_with("HTTP/") || code.len() != 3 {
        return None;
    }
    if code == "200" && !response.contains("\"error\"") {
        return Some(Probe::Written);
    }
    let answer = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Some(Probe::Answered(format!("{status}: {}", answer.trim())))
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Reports the stall with sqld's thread stacks and the tail of its log, ends the store
/// servers, and aborts. Written to stderr directly: the test harness captures `eprintln!`
/// output, and would drop it when the process aborts.
fn stalled(state: &WatchState, pid: u32, for_: Duration, error: &str) -> ! {
    let mut out = std::io::stderr().lock();
    let _ = writeln!(
        out,
        "\n=== sqld STALLED: no write completed on sqld (pid {pid}, http://127.0.0.1:{}) for \
         {:.0} s while the watchdog's write was pending (last attempt: {error}). \
         Its threads' stacks follow; then the test process aborts. ===",
        state.port,
        for_.as_secs_f64()
    );
    let stacks = thread_stacks(pid);
    let stacks_path = state.dir.join("sqld-stacks.txt");
    let _ = std::fs::write(&stacks_path, &stacks);
    let _ = writeln!(out, "{stacks}");
    let log = std::fs::read_to_string(state.dir.join("sqld.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    let _ = writeln!(out, "=== the last lines of sqld's log ===");
    for line in tail.iter().rev() {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "=== sqld STALLED (pid {pid}): aborting the test process; the stacks are also in {} ===",
        stacks_path.display()
    );
    let _ = out.flush();
    for pid in STORE_PIDS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    std::process::abort();
}

/// Every thread's stack in `pid`, by gdb or else eu-stack (`scripts/stores install` puts
/// gdb on the machine), or why there are none.
fn thread_stacks(pid: u32) -> String {
    let pid = pid.to_string();
    let tools: [(&str, Vec<&str>); 2] = [
        (
            "gdb",
            vec!["-p", &pid, "-batch", "-ex", "thread apply all bt"],
        ),
        ("eu-stack", vec!["-p", &pid]),
    ];
    let mut failures = Vec::new();
    for (tool, args) in tools {
        match run_with_deadline(tool, &args, Duration::from_secs(120)) {
            Ok(stacks) => return stacks,
            Err(why) => failures.push(format!("{tool}: {why}")),
        }
    }
    format!("(no stacks: {})", failures.join("; "))
}

fn run_with_deadline(program: &str, args: &[&str], deadline: Duration) -> Result<String, String> {
    let output =
        std::env::temp_dir().join(format!("sqld-stacks-{}-{program}.txt", std::process::id()));
    let file = std::fs::File::create(&output).map_err(|e| e.to_string())?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer in {} s", deadline.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&output).unwrap_or_default();
    let _ = std::fs::remove_file(&output);
    if status.success() && !text.trim().is_empty() {
        Ok(text)
    } else {
        Err(format!("{status}: {}", text.trim()))
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
        register_pid(child.id());
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

    /// Sets `key` to `value` (text), as another client of the same Redis would.
    pub fn set(&self, key: &str, value: &str) {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .exec(&mut self.connection())
            .expect("SET");
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
        unregister_pid(self.child.id());
    }
}

/// One sqld and one Redis, and the runtime config that puts the app's `default` database
/// and key-value store on them.
pub struct RemoteStores {
    pub sqld: Sqld,
    /// With `TEST_CELLS` > 1, the primaries of cells 1 … S-1 (`sqld` is cell 0's).
    pub cells: Vec<Sqld>,
    pub redis: Redis,
    runtime_config: PathBuf,
}

impl RemoteStores {
    /// A sqld and a Redis.
    pub fn start(dir: &Path) -> RemoteStores {
        RemoteStores::start_in_cells(dir, 1)
    }

    /// A sqld for each of `cells` cells, and a Redis.
    pub fn start_in_cells(dir: &Path, cells: usize) -> RemoteStores {
        let sqld = Sqld::start(&dir.join("sqld"));
        let cells: Vec<Sqld> = (1..cells)
            .map(|n| Sqld::start(&dir.join(format!("cell{n}"))))
            .collect();
        let redis = Redis::start(&dir.join("redis"));
        let runtime_config = dir.join("runtime-config.toml");
        cells
            .iter()
            .enumerate()
            .fold(
                RuntimeConfig::default().libsql_database("default", &sqld.url()),
                |config, (n, cell)| config.libsql_database(&format!("cell{}", n + 1), &cell.url()),
            )
            .redis(&redis.url())
            .write(&runtime_config);
        RemoteStores {
            sqld,
            cells,
            redis,
            runtime_config,
        }
    }

    pub fn runtime_config(&self) -> &Path {
        &self.runtime_config
    }
}

/// Writes a runtime config that puts the app's `default` database on the libSQL server at
/// `database` and its key-value store on the Redis at `redis`.
pub fn write_runtime_config(path: &Path, database: &str, redis: &str) {
    RuntimeConfig::default()
        .libsql_database("default", database)
        .redis(redis)
        .write(path);
}

/// A runtime config in Spin's format (which `spin-host` reads too), table by table.
#[derive(Debug, Default, Clone)]
pub struct RuntimeConfig(String);

impl RuntimeConfig {
    /// The SQLite database labelled `label` in a local file.
    pub fn file_database(mut self, label: &str, path: &Path) -> RuntimeConfig {
        self.0 += &format!(
            "[sqlite_database.{label}]\ntype = \"spin\"\npath = \"{}\"\n\n",
            path.display()
        );
        self
    }

    /// The SQLite database labelled `label` on the libSQL server at `url`.
    pub fn libsql_database(mut self, label: &str, url: &str) -> RuntimeConfig {
        self.0 += &format!(
            "[sqlite_database.{label}]\ntype = \"libsql\"\nurl = \"{url}\"\ntoken = \"\"\n\n"
        );
        self
    }

    /// The `default` key-value store on the Redis at `url`.
    pub fn redis(mut self, url: &str) -> RuntimeConfig {
        self.0 += &format!("[key_value_store.default]\ntype = \"redis\"\nurl = \"{url}\"\n\n");
        self
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.0).expect("write the runtime config");
    }
}

/// An edge deployment on loopback (docs/design.md, "Edge sites"): one sqld primary, a read
/// replica per site whose gRPC to the primary crosses a [`Link`], and one Redis; a runtime
/// config for an app at the primary (the one that migrates) and one per site. With cells
/// (docs/design.md, "Cells"), the same again for each cell but the directory's: its own
/// primary, and a replica of it at every site.
pub struct Sites {
    pub primary: Sqld,
    pub replicas: Vec<Sqld>,
    /// Each replica's link to the primary.
    pub links: Vec<Link>,
    /// Cells 1 … S-1, each a primary with a replica at every site.
    pub cells: Vec<SitesCell>,
    /// The sites' Redis (one, shared by every site).
    pub redis: Redis,
    /// The Redis beside the primaries, the home's.
    pub home_redis: Redis,
    primary_config: PathBuf,
    site_configs: Vec<PathBuf>,
}

/// One cell of an edge deployment: its primary, and its replica at each site with its link.
pub struct SitesCell {
    pub primary: Sqld,
    pub replicas: Vec<Sqld>,
    pub links: Vec<Link>,
}

impl SitesCell {
    /// A primary in `dir`, and a replica of it at each of `sites` sites, `rtt` away.
    fn start(dir: &Path, sites: usize, rtt: Duration) -> SitesCell {
        let primary = Sqld::start_primary(&dir.join("primary"));
        let grpc = primary.grpc_port().expect("a primary listens for gRPC");
        let (mut replicas, mut links) = (Vec::new(), Vec::new());
        for site in 1..=sites {
            let link = Link::start(grpc, rtt).expect("a link to the primary");
            replicas.push(Sqld::start_replica(
                &dir.join(format!("site-{site}")),
                &link.url(),
            ));
            links.push(link);
        }
        SitesCell {
            primary,
            replicas,
            links,
        }
    }
}

impl Sites {
    /// `sites` sites, each replica `rtt` away from the primary.
    pub fn start(dir: &Path, sites: usize, rtt: Duration) -> Sites {
        Sites::start_in_cells(dir, sites, rtt, 1)
    }

    /// `sites` sites of a market in `cells` cells, each replica `rtt` away from its primary.
    pub fn start_in_cells(dir: &Path, sites: usize, rtt: Duration, cells: usize) -> Sites {
        let SitesCell {
            primary,
            replicas,
            links,
        } = SitesCell::start(dir, sites, rtt);
        let cells: Vec<SitesCell> = (1..cells)
            .map(|n| SitesCell::start(&dir.join(format!("cell{n}")), sites, rtt))
            .collect();
        let redis = Redis::start(&dir.join("redis"));
        // The home's region has a Redis of its own: what a site's app remembers of its
        // database (a copy that lags) is not the home's.
        let home_redis = Redis::start(&dir.join("home-redis"));
        let config = |database: &dyn Fn(&SitesCell) -> String, own: String, redis: &Redis| {
            cells
                .iter()
                .enumerate()
                .fold(
                    RuntimeConfig::default().libsql_database("default", &own),
                    |config, (n, cell)| {
                        config.libsql_database(&format!("cell{}", n + 1), &database(cell))
                    },
                )
                .redis(&redis.url())
        };
        let primary_config = dir.join("runtime-config.primary.toml");
        config(&|cell| cell.primary.url(), primary.url(), &home_redis).write(&primary_config);
        let site_configs = (1..=sites)
            .map(|site| {
                let path = dir.join(format!("runtime-config.site-{site}.toml"));
                config(
                    &|cell| cell.replicas[site - 1].url(),
                    replicas[site - 1].url(),
                    &redis,
                )
                .write(&path);
                path
            })
            .collect();
        Sites {
            primary,
            replicas,
            links,
            cells,
            redis,
            home_redis,
            primary_config,
            site_configs,
        }
    }

    pub fn primary_config(&self) -> &Path {
        &self.primary_config
    }

    /// The runtime config of site `site` (from 1).
    pub fn site_config(&self, site: usize) -> &Path {
        &self.site_configs[site - 1]
    }
}
