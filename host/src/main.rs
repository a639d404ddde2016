//! `spin-host`: run a `spin.toml` like `spin up`, without the `spin` CLI.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use spin_host::{HostConfig, LoadSource, Server, SqliteMode, TimeDelta};

/// Runs a Spin app (spin.toml, manifest version 2) on wasmtime, like `spin up`.
///
/// Application variables come from SPIN_VARIABLE_<NAME> environment variables
/// or their defaults. State (the `default` key-value store and SQLite
/// database, and component logs) lives in the state directory, unless Spin's
/// runtime config file puts a store on Redis or a database on libSQL (sqld). The environment
/// is read once, at start (SPIN_VARIABLE_*, SPIN_HOST_CACHE_DIR, CARGO_TARGET_DIR,
/// SPIN_HOST_PROFILER=perfmap).
#[derive(Parser, Debug)]
#[command(name = "spin-host", version)]
struct Cli {
    /// The app manifest.
    #[arg(long, short = 'f', default_value = "spin.toml")]
    manifest: PathBuf,

    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,

    /// State directory [default: the runtime config's state_dir, else .spin beside the manifest].
    #[arg(long)]
    state_dir: Option<PathBuf>,

    /// Spin's runtime config file: [sqlite_database.<label>] of type "spin" (path) or
    /// "libsql" (url, token), [key_value_store.<label>] of type "spin" (path) or "redis" (url).
    #[arg(long)]
    runtime_config_file: Option<PathBuf>,

    /// Shift the components' wall clock by this many seconds (may be negative).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    clock_offset_secs: i64,

    /// Also print component stdout/stderr to this terminal.
    #[arg(long)]
    follow_logs: bool,

    /// Do not keep compiled components on disk.
    #[arg(long)]
    no_cache: bool,

    /// Directory for compiled components [default: target/spin-host-cache].
    #[arg(long)]
    cache_dir: Option<PathBuf>,

    /// Do not print a line per request.
    #[arg(long)]
    quiet: bool,

    /// How SQLite runs: `spin` (as `spin up`: a connection per open, each statement on a
    /// blocking thread) or `tuned` (pooled connections, inline reads, a writer queue).
    #[arg(long, value_enum, default_value_t = SqliteMode::Spin)]
    sqlite_mode: SqliteMode,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match spin_host::telemetry::init(env!("CARGO_PKG_VERSION")) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            return ExitCode::FAILURE;
        }
    };
    let mut config = HostConfig::new(&cli.manifest);
    config.listen = cli.listen;
    config.state_dir = cli.state_dir;
    config.runtime_config = cli.runtime_config_file.clone();
    config.inherit_env = true;
    config.clock_offset = TimeDelta::seconds(cli.clock_offset_secs);
    config.follow_logs = cli.follow_logs;
    config.log_requests = !cli.quiet;
    config.print_banner = true;
    config.disk_cache = !cli.no_cache;
    config.cache_dir = cli.cache_dir;
    config.sqlite_mode = cli.sqlite_mode;

    let server = match Server::start(config).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            return ExitCode::FAILURE;
        }
    };
    let summary = &server.app().runtime_config_summary;
    if let (Some(path), false) = (&cli.runtime_config_file, summary.is_empty()) {
        eprintln!(
            "Using runtime config {} from {:?}",
            summary.join(", "),
            path.display().to_string()
        );
    }
    for load in &server.app().loads {
        let how = match load.source {
            LoadSource::Compiled => "compiled",
            LoadSource::Disk => "loaded from cache",
            LoadSource::Memory => "reused",
        };
        eprintln!(
            "Component {} {how} in {:.2}s",
            load.component,
            load.elapsed.as_secs_f64()
        );
    }
    let state = server.app().state_dir.display().to_string();
    eprintln!("State in {state} (logs in {state}/logs)");

    tokio::select! {
        _ = shutdown_signal() => {
            eprintln!("Shutting down");
            server.shutdown().await;
        }
    }
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    ExitCode::SUCCESS
}

/// An error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| c.to_string().replace('\n', " "))
        .collect::<Vec<_>>()
        .join(": ")
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
