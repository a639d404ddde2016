//! The app as a shared deployment: several `spin-host` replicas, each in its own process
//! with its own state directory, on sqld (libSQL server) and one Redis through Spin's
//! runtime config: all on one sqld ([`Topology::OneSqld`]), or at edge sites, each site's
//! replicas on that site's sqld read replica of one primary ([`Topology::Sites`]). The
//! database is the same template the local host gets, placed as the (primary) sqld's
//! `default` database before it starts. The network between the apps and sqld, or between
//! each site's replica and the primary, is a [`Link`] of the given round trip. sqld and Redis
//! come from `scripts/stores install` (`target/stores/bin/sqld`, Debian's `redis-server`);
//! the benchmark stops only the children it started.
//!
//! Where the replicas are away from the primary ([`Topology::Sites`],
//! [`Topology::FarFromHome`]), a home app runs beside the primary on a Redis of its own, and
//! every replica's writes go to it (`home_url`) across a [`Link`] of the same round trip, whose
//! connections are counted. A build that predates `home_url` ignores it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use api_support::link::Link;
use api_support::stores::{
    SQLD_CHECKPOINT_INTERVAL_S, SQLD_MAX_LOG_SIZE_MB, SQLD_REPLICA_MAX_CONNECTIONS,
    write_runtime_config,
};

use crate::host::{HostProcess, HostSpec};

/// Where the replicas' database is, and how far.
#[derive(Debug, Clone, Copy)]
pub enum Topology {
    /// Every replica on one sqld, `rtt` away.
    OneSqld { rtt: Duration },
    /// `sites` sites, each with a sqld read replica `rtt` away from the primary and the
    /// replicas of the site next to it.
    Sites { sites: usize, rtt: Duration },
    /// Every replica on the primary, `rtt` away, with no replica of its own: its writes go to
    /// the home, `rtt` away too.
    FarFromHome { rtt: Duration },
}

impl Topology {
    /// How far the replicas are from the home, if they forward their writes to one.
    fn home_rtt(self) -> Option<Duration> {
        match self {
            Topology::OneSqld { .. } => None,
            Topology::Sites { rtt, .. } | Topology::FarFromHome { rtt } => Some(rtt),
        }
    }
}

/// sqld, Redis and the replicas; all stopped when dropped (replicas first).
pub struct SharedDeployment {
    pub replicas: Vec<HostProcess>,
    /// The primary (or only) sqld's pid and URL, reached directly.
    pub primary_pid: u32,
    pub primary_url: String,
    /// The primary's `default` database directory: its `data` and its replication log,
    /// `wallog` (read by `write-cost`, not by `gpu-bench`, which shares this module).
    #[allow(dead_code)]
    pub primary_database: PathBuf,
    /// Each site's read replica's URL, reached directly (none on one sqld).
    pub site_urls: Vec<String>,
    /// The home app beside the primary, and each group of replicas' link to it.
    pub home: Option<HostProcess>,
    pub home_links: Vec<Link>,
    servers: Vec<Child>,
    _links: Vec<Link>,
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn wait_listening(
    port: u16,
    what: &str,
    child: &mut Child,
    log: &Path,
) -> anyhow::Result<()> {
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

pub(crate) fn spawn(
    binary: &Path,
    args: &[String],
    log: &Path,
    what: &str,
) -> anyhow::Result<Child> {
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

/// A sqld with its data in `db_path` and its output in `log`, with the deployed flags
/// (deploy/sqld.yaml) and `role_args`, listening on a free loopback port: it and its port.
pub(crate) fn start_sqld(
    sqld_bin: &Path,
    db_path: &Path,
    log: &Path,
    role_args: &[String],
) -> anyhow::Result<(Child, u16)> {
    let port = free_port()?;
    let mut args = vec![
        "--db-path".into(),
        db_path.display().to_string(),
        "--http-listen-addr".into(),
        format!("127.0.0.1:{port}"),
        "--no-welcome".into(),
        "--disable-metrics".into(),
        "--checkpoint-interval-s".into(),
        SQLD_CHECKPOINT_INTERVAL_S.to_string(),
    ];
    // As deployed, unless the caller sizes the log itself (sqld refuses a flag twice).
    if !role_args.iter().any(|arg| arg == "--max-log-size") {
        args.extend(["--max-log-size".into(), SQLD_MAX_LOG_SIZE_MB.to_string()]);
    }
    args.extend_from_slice(role_args);
    let mut sqld = spawn(sqld_bin, &args, log, "sqld")?;
    if let Err(e) = wait_listening(port, "sqld", &mut sqld, log) {
        let _ = sqld.kill();
        let _ = sqld.wait();
        return Err(e);
    }
    Ok((sqld, port))
}

impl SharedDeployment {
    /// Starts sqld on a copy of `template` as `topology` says, Redis, and `replicas` hosts of
    /// spec `replica` (at each site, with sites), each with a state directory of its own and
    /// its runtime config.
    pub fn start(
        root: &Path,
        template: &Path,
        work: &Path,
        replicas: usize,
        replica: &HostSpec<'_>,
        topology: Topology,
    ) -> anyhow::Result<SharedDeployment> {
        Self::start_with(root, template, work, replicas, replica, topology, &[])
    }

    /// [`SharedDeployment::start`], the primary sqld started with `primary_args` besides
    /// (e.g. `--max-log-size`).
    pub fn start_with(
        root: &Path,
        template: &Path,
        work: &Path,
        replicas: usize,
        replica: &HostSpec<'_>,
        topology: Topology,
        primary_args: &[String],
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
            primary_pid: 0,
            primary_url: String::new(),
            primary_database: database.clone(),
            site_urls: Vec::new(),
            home: None,
            home_links: Vec::new(),
            servers: Vec::new(),
            _links: Vec::new(),
        };
        let grpc_port = free_port()?;
        let mut primary_flags = match topology {
            Topology::OneSqld { .. } | Topology::FarFromHome { .. } => Vec::new(),
            Topology::Sites { .. } => vec![
                "--grpc-listen-addr".to_owned(),
                format!("127.0.0.1:{grpc_port}"),
            ],
        };
        primary_flags.extend_from_slice(primary_args);
        let sqld_port = deployment.start_sqld(&sqld_bin, &dir, "sqld", &primary_flags)?;
        deployment.primary_pid = deployment.servers[0].id();
        deployment.primary_url = format!("http://127.0.0.1:{sqld_port}");
        let redis_port = deployment.start_redis(&dir, "redis")?;
        // The database each group of replicas is on: one sqld, or each site's replica.
        let databases: Vec<u16> = match topology {
            Topology::OneSqld { rtt } | Topology::FarFromHome { rtt } if rtt.is_zero() => {
                vec![sqld_port]
            }
            Topology::OneSqld { rtt } | Topology::FarFromHome { rtt } => {
                let link = Link::start(sqld_port, rtt)?;
                let port = link.port();
                deployment._links.push(link);
                vec![port]
            }
            Topology::Sites { sites, rtt } => {
                let mut ports = Vec::new();
                for site in 1..=sites {
                    let link = Link::start(grpc_port, rtt)?;
                    let primary = vec![
                        "--primary-grpc-url".to_owned(),
                        link.url(),
                        "--max-concurrent-connections".to_owned(),
                        SQLD_REPLICA_MAX_CONNECTIONS.to_string(),
                    ];
                    deployment._links.push(link);
                    let name = format!("site-{site}");
                    let port = deployment.start_sqld(&sqld_bin, &dir, &name, &primary)?;
                    deployment
                        .site_urls
                        .push(format!("http://127.0.0.1:{port}"));
                    ports.push(port);
                }
                ports
            }
        };
        if let Some(rtt) = topology.home_rtt() {
            let home_redis = deployment.start_redis(&dir, "home-redis")?;
            let runtime_config = dir.join("runtime-config-home.toml");
            write_runtime_config(
                &runtime_config,
                &format!("http://127.0.0.1:{sqld_port}"),
                &format!("redis://127.0.0.1:{home_redis}"),
            );
            let home = HostProcess::start(&HostSpec {
                state_dir: &dir.join("home"),
                runtime_config: Some(&runtime_config),
                env: replica.env.clone(),
                ..*replica
            })?;
            let port = home.base.rsplit(':').next().unwrap_or_default().parse()?;
            deployment.home = Some(home);
            for _ in &databases {
                deployment.home_links.push(Link::start(port, rtt)?);
            }
        }
        for (site, database) in databases.iter().enumerate() {
            let runtime_config = dir.join(format!("runtime-config-{site}.toml"));
            write_runtime_config(
                &runtime_config,
                &format!("http://127.0.0.1:{database}"),
                &format!("redis://127.0.0.1:{redis_port}"),
            );
            let mut env = replica.env.clone();
            if let Some(link) = deployment.home_links.get(site) {
                env.push(("SPIN_VARIABLE_HOME_URL", link.url()));
            }
            for i in 0..replicas {
                let state = dir.join(format!("replica-{site}-{i}"));
                let host = HostProcess::start(&HostSpec {
                    state_dir: &state,
                    runtime_config: Some(&runtime_config),
                    env: env.clone(),
                    ..*replica
                })?;
                deployment.replicas.push(host);
            }
        }
        Ok(deployment)
    }

    /// Starts a Redis in `dir` named `name`; its port.
    fn start_redis(&mut self, dir: &Path, name: &str) -> anyhow::Result<u16> {
        let redis_port = free_port()?;
        let log = dir.join(format!("{name}.log"));
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
        self.servers.push(redis);
        ready?;
        Ok(redis_port)
    }

    /// Starts a sqld with its data in `dir/name` (the primary's is `dir/sqld`), `role_args`
    /// making it a primary or a read replica; its port.
    fn start_sqld(
        &mut self,
        sqld_bin: &Path,
        dir: &Path,
        name: &str,
        role_args: &[String],
    ) -> anyhow::Result<u16> {
        let log = dir.join(format!("{name}.log"));
        let (sqld, port) = start_sqld(sqld_bin, &dir.join(name), &log, role_args)?;
        self.servers.push(sqld);
        Ok(port)
    }

    /// Connections the replicas have opened to the home so far; `None` where they forward
    /// their writes to none.
    pub fn home_connections(&self) -> Option<u64> {
        (!self.home_links.is_empty()).then(|| self.home_links.iter().map(Link::connections).sum())
    }

    pub fn bases(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.base.clone()).collect()
    }
}

impl Drop for SharedDeployment {
    fn drop(&mut self) {
        self.replicas.clear();
        self.home = None;
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
