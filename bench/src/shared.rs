//! The app as a shared deployment: several `spin-host` replicas, each in its own process
//! with its own state directory, on one sqld (libSQL server) and one Redis through Spin's
//! runtime config. The database is the same template the local host gets, placed as sqld's
//! `default` database before sqld starts. sqld and Redis come from `scripts/stores install`
//! (`target/stores/bin/sqld`, Debian's `redis-server`); the benchmark stops only the
//! children it started.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::host::{HostProcess, HostSpec};

/// sqld, Redis and the replicas; all stopped when dropped (replicas first).
pub struct SharedDeployment {
    pub replicas: Vec<HostProcess>,
    servers: Vec<Child>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(port: u16, what: &str, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited with {status}; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("{what} did not listen on {port}; see {}", log.display())
}

fn spawn(binary: &Path, args: &[String], log: &Path, what: &str) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| {
            format!(
                "cannot start {what} ({}): run scripts/stores install",
                binary.display()
            )
        })
}

impl SharedDeployment {
    /// Starts sqld on a copy of `template`, Redis, and `replicas` hosts of spec `replica`,
    /// each with a state directory of its own and the deployment's runtime config; with a
    /// non-zero `rtt`, the hosts reach sqld through a network of that round trip
    /// ([`crate::netdelay`]).
    pub fn start(
        root: &Path,
        template: &Path,
        work: &Path,
        replicas: usize,
        replica: &HostSpec<'_>,
        rtt: std::time::Duration,
    ) -> anyhow::Result<SharedDeployment> {
        let dir = work.join("shared");
        let database = dir.join("sqld/dbs/default");
        std::fs::create_dir_all(&database)?;
        std::fs::copy(template, database.join("data"))
            .context("placing the fixtures as sqld's database")?;
        let sqld_bin = std::env::var_os("SQLD_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/stores/bin/sqld"));
        let mut deployment = SharedDeployment {
            replicas: Vec::new(),
            servers: Vec::new(),
        };
        let sqld_port = free_port()?;
        let log = dir.join("sqld.log");
        let mut sqld = spawn(
            &sqld_bin,
            &[
                "--db-path".into(),
                dir.join("sqld").display().to_string(),
                "--http-listen-addr".into(),
                format!("127.0.0.1:{sqld_port}"),
                "--no-welcome".into(),
                "--disable-metrics".into(),
                "--checkpoint-interval-s".into(),
                "5".into(),
            ],
            &log,
            "sqld",
        )?;
        let ready = wait_listening(sqld_port, "sqld", &mut sqld, &log);
        deployment.servers.push(sqld);
        ready?;
        let redis_port = free_port()?;
        let log = dir.join("redis.log");
        let mut redis = spawn(
            Path::new("redis-server"),
            &[
                "--bind".into(),
                "127.0.0.1".into(),
                "--port".into(),
                redis_port.to_string(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.display().to_string(),
            ],
            &log,
            "redis-server",
        )?;
        let ready = wait_listening(redis_port, "redis-server", &mut redis, &log);
        deployment.servers.push(redis);
        ready?;
        let sqld_port = match rtt.is_zero() {
            true => sqld_port,
            false => crate::netdelay::DelayProxy::start(sqld_port, rtt)?.port,
        };
        let runtime_config = dir.join("runtime-config.toml");
        std::fs::write(
            &runtime_config,
            format!(
                "[sqlite_database.default]\ntype = \"libsql\"\nurl = \"http://127.0.0.1:{sqld_port}\"\ntoken = \"\"\n\n\
                 [key_value_store.default]\ntype = \"redis\"\nurl = \"redis://127.0.0.1:{redis_port}\"\n"
            ),
        )?;
        for i in 0..replicas {
            let state = dir.join(format!("replica-{i}"));
            let host = HostProcess::start(&HostSpec {
                state_dir: &state,
                runtime_config: Some(&runtime_config),
                env: replica.env.clone(),
                ..*replica
            })?;
            deployment.replicas.push(host);
        }
        Ok(deployment)
    }

    pub fn bases(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.base.clone()).collect()
    }
}

impl Drop for SharedDeployment {
    fn drop(&mut self) {
        self.replicas.clear();
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
