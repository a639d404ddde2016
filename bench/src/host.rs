//! The project's host (`spin-host`, release build) as a subprocess, as it runs in production:
//! its own process, its own runtime, real TCP. The benchmark only ever stops the child it
//! started.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The operator token every host the benchmarks start runs with.
pub const OPERATOR_TOKEN: &str = "bench-operator-token-0123456789abcdef";

/// How to start a host.
pub struct HostSpec<'a> {
    pub binary: &'a Path,
    pub manifest: &'a Path,
    pub state_dir: &'a Path,
    /// Compiled components are cached here (a fresh directory makes a cold start).
    pub cache_dir: &'a Path,
    pub env: Vec<(&'static str, String)>,
    /// A path that answers 200 once the app serves.
    pub ready_path: &'a str,
    /// Spin's runtime config file (the shared deployment's sqld and Redis).
    pub runtime_config: Option<&'a Path>,
    /// `--sqlite-mode` (`spin` or `tuned`); `None` leaves the host's default.
    pub sqlite_mode: Option<&'a str>,
    /// Log a line per request (with its SQLite statements) to `host.log`.
    pub log_requests: bool,
}

/// A running `spin-host`; killed when dropped.
pub struct HostProcess {
    child: Child,
    pub base: String,
    /// From spawning the process to the first 200 on the ready path.
    pub time_to_first_response: Duration,
}

impl HostProcess {
    pub fn start(spec: &HostSpec<'_>) -> anyhow::Result<HostProcess> {
        if !spec.binary.is_file() {
            bail!(
                "{} does not exist: build it with `cargo build --release -p spin-host` (scripts/bench does)",
                spec.binary.display()
            );
        }
        std::fs::create_dir_all(spec.state_dir)?;
        let addr = free_port()?;
        let log = std::fs::File::create(spec.state_dir.join("host.log"))?;
        let mut command = Command::new(spec.binary);
        command
            .arg("--manifest")
            .arg(spec.manifest)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--state-dir")
            .arg(spec.state_dir)
            .arg("--cache-dir")
            .arg(spec.cache_dir)
            .args(
                spec.runtime_config
                    .iter()
                    .flat_map(|path| [Path::new("--runtime-config-file"), path]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if !spec.log_requests {
            command.arg("--quiet");
        }
        if let Some(mode) = spec.sqlite_mode {
            command.arg("--sqlite-mode").arg(mode);
        }
        for (name, value) in &spec.env {
            command.env(name, value);
        }
        let started = Instant::now();
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", spec.binary.display()))?;
        let mut host = HostProcess {
            child,
            base: format!("http://{addr}"),
            time_to_first_response: Duration::ZERO,
        };
        host.wait_ready(addr, spec.ready_path, started, spec.state_dir)?;
        Ok(host)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls with a fresh connection every millisecond until the ready path answers 200.
    fn wait_ready(
        &mut self,
        addr: SocketAddr,
        path: &str,
        started: Instant,
        state_dir: &Path,
    ) -> anyhow::Result<()> {
        let deadline = started + Duration::from_secs(600);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "spin-host exited with {status} before serving; see {}",
                    state_dir.join("host.log").display()
                );
            }
            if raw_get_status(addr, path) == Some(200) {
                self.time_to_first_response = started.elapsed();
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("spin-host did not answer {path} within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// The status of `GET path` over a new connection, or `None` if nothing answers yet.
fn raw_get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The sizes of the `.wasm` files a manifest names, as `(component, bytes)`.
pub fn wasm_sizes(manifest: &Path) -> anyhow::Result<Vec<(String, u64, PathBuf)>> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let dir = manifest.parent().unwrap_or(Path::new("."));
    let mut sizes = Vec::new();
    let mut component = None;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("[component.")
            .and_then(|rest| rest.strip_suffix(']'))
            .filter(|name| !name.contains('.'))
        {
            component = Some(name.to_owned());
        } else if let (Some(name), Some(source)) = (
            component.as_ref(),
            line.strip_prefix("source = \"")
                .and_then(|s| s.strip_suffix('"')),
        ) {
            let path = dir.join(source);
            let bytes = std::fs::metadata(&path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .len();
            sizes.push((name.clone(), bytes, path));
        }
    }
    Ok(sizes)
}

/// The app as the benchmarks serve it: `manifest` run by `binary`, its state in `state_dir`,
/// its compiled components cached in `cache_dir`, ready once health answers.
pub fn app_spec<'a>(
    binary: &'a Path,
    manifest: &'a Path,
    state_dir: &'a Path,
    cache_dir: &'a Path,
) -> HostSpec<'a> {
    HostSpec {
        binary,
        manifest,
        state_dir,
        cache_dir,
        env: vec![
            ("SPIN_VARIABLE_OPERATOR_TOKEN", OPERATOR_TOKEN.to_owned()),
            ("SPIN_VARIABLE_AUDIT_KEY", "bench-audit-key".to_owned()),
        ],
        ready_path: "/v1/healthz",
        runtime_config: None,
        sqlite_mode: None,
        log_requests: false,
    }
}

/// The workspace the benchmarks are built in.
pub fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace directory")
}
