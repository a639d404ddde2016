//! `gpu-bench`: what a request costs through the project's host, and how cost grows.
//!
//! One run measures, on the same machine at the same time:
//! - release, reclaim, dry run and a GET through the `spin-host` release binary over real
//!   HTTP against real SQLite files, at concurrency 1 and 32, with the host's SQLite run as
//!   Spin runs it (`--sqlite-mode spin`, what users get) and tuned (`--sqlite-mode tuned`);
//! - the SQLite statements each request type costs (and how many under the write lock), from
//!   the host's request log;
//! - baseline (a): the hello-world probe component through the same host (HTTP +
//!   instantiation floor); baseline (b): the same store operation natively (storage floor);
//! - the scale curve: release/reclaim of 1 unit and a dry run on reservations of 8, 1 000
//!   and 100 000 units (with as many VMs on the node), minimal and full representations;
//! - cold start: each component's `.wasm` size and the host's time to first response;
//! - the same throughput workloads on a shared deployment: several replicas on one sqld and
//!   one Redis (`--shared-replicas`), beside the one host on local files.
//!
//! With `--cells 1,2,4` it measures the market in cells instead (`cells.rs`).
//!
//! It prints a table and writes `bench-results/bench.json`. See README.md, "Benchmarks".

mod cells;
mod fixtures;
mod host;
mod load;
mod report;
mod shared;
mod workloads;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use reservations_store::capacity::Representation;
use reservations_store::share::EDGE_WRITE_SHARE;
use serde_json::json;

use crate::fixtures::{
    MARKET_NODE, NOTICE_NODE, NOTICE_UNITS, SPREAD_NODES, SPREAD_UNITS, THROUGHPUT_NODE,
    THROUGHPUT_UNITS, scale_node, spread_node, unit_id,
};
use crate::host::{HostProcess, HostSpec, OPERATOR_TOKEN, app_spec, workspace};
use crate::load::{Server, Stats, Step, Timing};
use crate::report::{Measurement, ScalePoint, Side};
use crate::shared::Topology;
use crate::workloads::{HttpWorker, NativeWorker, Op, Target, Units};

/// Runs one workload at a concurrency on one side.
type Workload<'a> = dyn Fn(&Target<'_>, usize, Timing) -> Stats + 'a;

#[derive(Parser, Debug)]
#[command(
    name = "gpu-bench",
    about = "Benchmarks the app through its host (see README.md)"
)]
struct Cli {
    /// Measured seconds per throughput workload.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Unmeasured warm-up seconds before each throughput workload.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Concurrency levels of the throughput workloads.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 32])]
    concurrency: Vec<usize>,
    /// Reservation sizes of the scale curve (the smallest also serves the GET workload).
    #[arg(long, value_delimiter = ',', default_values_t = [8usize, 1_000, 100_000])]
    scales: Vec<usize>,
    /// Sequential iterations per scale point with `Prefer: return=minimal`.
    #[arg(long, default_value_t = 300)]
    scale_iterations: usize,
    /// Sequential iterations per scale point with the full representation.
    #[arg(long, default_value_t = 30)]
    full_iterations: usize,
    /// Skip the cold start that compiles every component (it takes a while).
    #[arg(long)]
    no_cold_start: bool,
    /// Skip the scale curve.
    #[arg(long)]
    no_scale: bool,
    /// Throughput workloads to run: release, reclaim, reclaim-notice, dry-run, get, market, events.
    #[arg(long, value_delimiter = ',', default_values_t = ["release".to_owned(), "reclaim".to_owned(), "reclaim-notice".to_owned(), "dry-run".to_owned(), "get".to_owned(), "market".to_owned(), "events".to_owned()])]
    ops: Vec<String>,
    /// Instead of benchmarking, serve a stream of release/reclaim requests for this many
    /// seconds under `perf record -g` and write bench-results/perf.{data,txt}.
    #[arg(long)]
    profile_seconds: Option<f64>,
    /// What to profile: `release-reclaim` (pairs on one unit) or `dry-run`.
    #[arg(long, default_value = "release-reclaim")]
    profile_op: String,
    /// The host binary.
    #[arg(long)]
    host_bin: Option<PathBuf>,
    /// The app's manifest [default: spin.toml of the workspace].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// A snapshot of an earlier build to compare against in the same run: a directory with
    /// `spin-host` and a `spin.toml` whose sources point at that build's `.wasm` files.
    #[arg(long)]
    before: Option<PathBuf>,
    /// The fixtures database to start from instead of building one: one that an earlier
    /// build's `gpu-bench` made, so that a `--before` build on an older schema runs on it as
    /// it is, and this build on a copy it has migrated, as it would a deployed database.
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// Where to write results (bench.json) and scratch state.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Replicas of the shared deployment (one sqld, one Redis; `scripts/stores install`
    /// provides them) measured beside the local host; 0 skips it.
    #[arg(long, default_value_t = 3)]
    shared_replicas: usize,
    /// Skip the host with tuned SQLite (measure only the Spin-like default).
    #[arg(long)]
    no_tuned: bool,
    /// Skip the host that exports its traces, metrics and logs (OTLP over HTTP/protobuf) to
    /// a receiver on loopback: the cost of watching.
    #[arg(long)]
    no_watched: bool,
    /// Rounds of the cost of watching, each measuring the host exporting nothing and the
    /// host exporting, the one that goes first alternating.
    #[arg(long, default_value_t = 3)]
    watching_rounds: usize,
    /// The RTT curve: releases and reclaims on the shared deployment with a network of this
    /// many milliseconds' round trip between the app and sqld, modelled at the TCP level
    /// (each new connection pays its handshake); the flag with no value skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values_t = [0u64, 20, 80])]
    rtt_ms: Vec<u64>,
    /// Edge sites: 2 sites of 2 replicas, each site's on its own sqld read replica this many
    /// milliseconds' round trip from the primary, against the same 4 replicas all on the
    /// primary across that network (the far primary); the flag with no value skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values_t = [20u64, 80])]
    edge_rtt_ms: Vec<u64>,
    /// How many write statements of one org this build's replicas on sqld and Redis run at
    /// once (`org_write_share`, as the edge deployments set it); 0: no shares. A `--before`
    /// build runs with its manifest's default.
    #[arg(long, default_value_t = EDGE_WRITE_SHARE)]
    org_write_share: i64,
    /// Instead of the workloads above: the market in each of these numbers of cells, one
    /// after the other, each cell on its own sqld primary (writes/s, each primary's CPU per
    /// write, the projection for primaries on cores of their own, and the listings across
    /// cells).
    #[arg(long, value_delimiter = ',')]
    cells: Vec<usize>,
    /// With `--cells`: concurrent writers, each on a node of its own.
    #[arg(long, default_value_t = 64)]
    cells_writers: usize,
    /// With `--cells`: app replicas, on every cell.
    #[arg(long, default_value_t = 3)]
    cells_replicas: usize,
    /// With `--cells`: round trip between the app and each primary, in milliseconds.
    #[arg(long, default_value_t = 20)]
    cells_rtt_ms: u64,
    /// With `--cells`: measured seconds of writes per number of cells.
    #[arg(long, default_value_t = 20.0)]
    cells_seconds: f64,
    /// With `--cells`: requests of each listing across cells, one at a time.
    #[arg(long, default_value_t = 40)]
    cells_listings: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if !cli.cells.is_empty() {
        return cells::run(&cells::Options {
            cells: cli.cells,
            writers: cli.cells_writers,
            replicas: cli.cells_replicas,
            rtt_ms: cli.cells_rtt_ms,
            seconds: cli.cells_seconds,
            listings: cli.cells_listings,
        });
    }
    let run = Run::prepare(cli)?;
    if let Some(seconds) = run.cli.profile_seconds {
        return run.profile(seconds);
    }
    let ops = workload_ops(&run.cli.ops)?;
    let load_before = load_average();
    let sizes = wasm_sizes(&run)?;
    let cold_start = cold_start(&run)?;
    let hosts = AppHosts::start(&run)?;
    let measurements = side_by_side(&run, &hosts, &ops)?;
    let watching = watching_cost(&run, &hosts);
    let rtt_points = rtt_curve(&run, &ops)?;
    let (edge_points, edge_lags, edge_cold_writes) = edge_curve(&run)?;
    let scale_points = scale_points(&run, &hosts);
    let warm_start = hosts.app.time_to_first_response;
    drop(hosts);
    let statement_counts = statement_counts(&run)?;
    let results = report::Results {
        measurements,
        scale_points,
        sizes,
        cold_start,
        warm_start,
        statement_counts,
        rtt_points,
        edge_points,
        edge_lags,
        edge_cold_writes,
        watching,
    };
    print!("{}", results.table());
    run.write_report(&results, load_before, load_average())?;
    let failures = results.failures();
    if !failures.is_empty() {
        for (what, errors, first) in &failures {
            eprintln!("{what}: {errors} failed requests, first: {first:?}");
        }
        anyhow::bail!("{} measurements had failed requests", failures.len());
    }
    Ok(())
}

/// One run's settings, paths and fixtures.
struct Run {
    cli: Cli,
    root: PathBuf,
    out_dir: PathBuf,
    /// Scratch space for state directories, removed at the end.
    work: PathBuf,
    host_bin: PathBuf,
    app_manifest: PathBuf,
    probe_manifest: PathBuf,
    cache_dir: PathBuf,
    /// Reservation sizes of the scale curve, smallest first.
    scales: Vec<usize>,
    timing: Timing,
    /// The fixtures' database, copied into every host's state.
    template: PathBuf,
    /// The fixtures of the `--before` build: `template` unless `--fixtures` gave older ones.
    before_template: PathBuf,
    /// How long each part of the fixtures took to build.
    setup: Vec<(String, f64)>,
}

/// A build the shared deployments are measured with: this one, or the `--before` snapshot.
struct Build {
    name: &'static str,
    host_bin: PathBuf,
    manifest: PathBuf,
    /// Whether it is run with `--org-write-share` (a `--before` build keeps its manifest's
    /// defaults, which may predate the variable).
    takes_org_write_share: bool,
    /// The fixtures its deployments start from.
    template: PathBuf,
}

impl Build {
    /// Its host as a replica of a deployment on sqld and Redis.
    fn deployment_spec<'a>(&'a self, run: &'a Run) -> HostSpec<'a> {
        let spec = app_spec(&self.host_bin, &self.manifest, &run.work, &run.cache_dir);
        match self.takes_org_write_share {
            true => run.with_org_write_share(spec),
            false => spec,
        }
    }
}

impl Run {
    /// Reads the command line, makes the scratch space and builds the fixtures.
    fn prepare(cli: Cli) -> anyhow::Result<Run> {
        let root = workspace();
        let out_dir = cli
            .out_dir
            .clone()
            .unwrap_or_else(|| root.join("bench-results"));
        let work = out_dir.join("work");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        let mut scales = cli.scales.clone();
        scales.sort_unstable();
        scales.dedup();
        if scales.is_empty() || scales[0] < 2 {
            bail!("--scales needs sizes of at least 2 units (unit 0 is released, unit 1 has a VM)");
        }
        eprintln!("load before: {}", load_average());
        let template = work.join("template.db");
        let (setup, before_template) = match &cli.fixtures {
            Some(made) => {
                eprintln!("starting from the fixtures in {}", made.display());
                let before_template = work.join("before-template.db");
                std::fs::copy(made, &before_template).context("copying --fixtures")?;
                std::fs::copy(made, &template).context("copying --fixtures")?;
                fixtures::migrate(&template)?;
                (Vec::new(), before_template)
            }
            None => {
                eprintln!("building the fixtures (native store, one SQLite file)...");
                (fixtures::build(&template, &scales)?, template.clone())
            }
        };
        for (what, seconds) in &setup {
            eprintln!("  {what}: {seconds:.1}s");
        }
        Ok(Run {
            host_bin: cli
                .host_bin
                .clone()
                .unwrap_or_else(|| root.join("target/release/spin-host")),
            app_manifest: cli
                .manifest
                .clone()
                .unwrap_or_else(|| root.join("spin.toml")),
            probe_manifest: root.join("host/fixtures/probe/spin.toml"),
            cache_dir: root.join("target/spin-host-cache"),
            timing: Timing {
                warmup: Duration::from_secs_f64(cli.warmup),
                measure: Duration::from_secs_f64(cli.seconds),
            },
            cli,
            root,
            out_dir,
            work,
            scales,
            template,
            before_template,
            setup,
        })
    }

    /// The app's host with its state in `state_dir`.
    fn app_spec<'a>(&'a self, state_dir: &'a Path) -> HostSpec<'a> {
        app_spec(
            &self.host_bin,
            &self.app_manifest,
            state_dir,
            &self.cache_dir,
        )
    }

    /// This build's host as a replica of a deployment on sqld and Redis: with each org's
    /// share of the writes, as at the edge.
    fn deployment_spec<'a>(&'a self, state_dir: &'a Path) -> HostSpec<'a> {
        self.with_org_write_share(self.app_spec(state_dir))
    }

    fn with_org_write_share<'a>(&self, mut spec: HostSpec<'a>) -> HostSpec<'a> {
        spec.env.push((
            "SPIN_VARIABLE_ORG_WRITE_SHARE",
            self.cli.org_write_share.to_string(),
        ));
        spec
    }

    /// This build, then the `--before` snapshot when there is one.
    fn builds(&self) -> Vec<Build> {
        let this = Build {
            name: "this",
            host_bin: self.host_bin.clone(),
            manifest: self.app_manifest.clone(),
            takes_org_write_share: true,
            template: self.template.clone(),
        };
        std::iter::once(this).chain(self.before_build()).collect()
    }

    /// The `--before` snapshot, when there is one.
    fn before_build(&self) -> Option<Build> {
        self.cli.before.as_ref().map(|dir| Build {
            name: "before",
            host_bin: dir.join("spin-host"),
            manifest: dir.join("spin.toml"),
            takes_org_write_share: false,
            template: self.before_template.clone(),
        })
    }

    /// The state of the app's host as Spin runs SQLite.
    fn app_state(&self) -> PathBuf {
        self.work.join("app-state")
    }

    /// The state of the app's host with SQLite tuned.
    fn tuned_state(&self) -> PathBuf {
        self.work.join("tuned-state")
    }

    /// The reservation the throughput workloads use: the smallest of the scale curve.
    fn smallest(&self) -> String {
        scale_node(self.scales[0])
    }

    /// `--profile-seconds`: one workload under `perf`, nothing else.
    fn profile(&self, seconds: f64) -> anyhow::Result<()> {
        let stream = match self.cli.profile_op.as_str() {
            "release-reclaim" => vec![Op::Release, Op::Reclaim],
            "dry-run" => vec![Op::DryRun],
            other => bail!("--profile-op {other:?}: release-reclaim or dry-run"),
        };
        profile(
            &self.app_spec(&self.work),
            &self.template,
            &self.out_dir,
            seconds,
            &stream,
        )
    }

    /// Writes `bench.json` beside the table, and clears the scratch space.
    fn write_report(
        &self,
        results: &report::Results,
        load_before: String,
        load_after: String,
    ) -> anyhow::Result<()> {
        let document = json!({
            "meta": {
                "date": chrono::Utc::now().to_rfc3339(),
                "commit": git_commit(&self.root),
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                "loadBefore": load_before,
                "loadAfter": load_after,
                "secondsPerWorkload": self.cli.seconds,
                "warmupSeconds": self.cli.warmup,
                "throughputReservationUnits": THROUGHPUT_UNITS,
                "fixtureSetupSeconds": self.setup.iter().map(|(what, s)| json!({"part": what, "seconds": s})).collect::<Vec<_>>(),
                "notes": [
                    "host = spin-host release binary in its own process, real HTTP/1.1 keep-alive, real SQLite files, SQLite run as Spin runs it (--sqlite-mode spin: a connection per open, each statement on a blocking thread, SQLite's busy handler with a 5 s timeout)",
                    "tuned = the same host with --sqlite-mode tuned (pooled connections, inline reads, a writer queue)",
                    "statements = SQLite statements per request from the host's request log (Prefer: return=minimal), and how many ran inside a write transaction",
                    "release/reclaim/dry-run throughput rows send Prefer: return=minimal; releases each take a fresh unit of a 20 000-unit reservation, reclaims take them back",
                    "GET reservation reads the smallest scale reservation in full",
                    "GET market lists the 1 000 released, idle units of a 100 000-unit node in one page (limit=1000)",
                    "native = reservations_store::Store over rusqlite in this process: same SQL, no Wasm, no HTTP, no auth, no JSON",
                    "the load generator runs on the same cores as the host",
                ],
            },
            "results": results.json(),
        });
        let path = self.out_dir.join("bench.json");
        std::fs::write(&path, serde_json::to_string_pretty(&document)?)?;
        eprintln!("wrote {}", path.display());
        // The fixtures stay, for a later build's `--fixtures`; the deployments' state goes.
        let kept = self.out_dir.join("fixtures.db");
        std::fs::rename(&self.template, &kept)?;
        eprintln!("kept the fixtures as {}", kept.display());
        let _ = std::fs::remove_dir_all(&self.work);
        Ok(())
    }
}

/// The workloads `--ops` names.
fn workload_ops(names: &[String]) -> anyhow::Result<Vec<Op>> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "release" => Ok(Op::Release),
            "reclaim" => Ok(Op::Reclaim),
            "reclaim-notice" => Ok(Op::ReclaimNotice),
            "dry-run" => Ok(Op::DryRun),
            "get" => Ok(Op::Get),
            "market" => Ok(Op::Market),
            "events" => Ok(Op::Events),
            other => bail!("--ops: unknown workload {other:?}"),
        })
        .collect()
}

/// Each component's `.wasm` size (and the probe's).
fn wasm_sizes(run: &Run) -> anyhow::Result<Vec<(String, u64)>> {
    let mut sizes = host::wasm_sizes(&run.app_manifest)?;
    sizes.extend(
        host::wasm_sizes(&run.probe_manifest)?
            .into_iter()
            .filter(|(name, _, _)| name == "probe"),
    );
    Ok(sizes
        .into_iter()
        .map(|(name, bytes, _)| (name, bytes))
        .collect())
}

/// The host's time to its first response from an empty compilation cache, and from the disk
/// cache that start left (unless `--no-cold-start`).
fn cold_start(run: &Run) -> anyhow::Result<Vec<(String, Duration)>> {
    let mut cold_start = Vec::new();
    if run.cli.no_cold_start {
        return Ok(cold_start);
    }
    eprintln!("cold start: compiling every component into an empty cache...");
    let cold_cache = run.work.join("cold-cache");
    for label in [
        "empty cache (compiles every component)",
        "disk cache of the previous start",
    ] {
        let state = run.work.join(format!("cold-state-{}", cold_start.len()));
        let spec = app_spec(&run.host_bin, &run.app_manifest, &state, &cold_cache);
        let host = HostProcess::start(&spec)?;
        cold_start.push((label.to_owned(), host.time_to_first_response));
    }
    Ok(cold_start)
}

/// The app's hosts on local files, each with a copy of the fixtures: SQLite as Spin runs it,
/// and tuned (unless `--no-tuned`); and the same store natively.
struct AppHosts {
    app: HostProcess,
    app_token: String,
    tuned: Option<(HostProcess, String)>,
    /// The host exporting to the receiver beside it.
    watched: Option<(HostProcess, String, api_support::otlp::Receiver)>,
    native_db: PathBuf,
}

impl AppHosts {
    fn start(run: &Run) -> anyhow::Result<AppHosts> {
        eprintln!("starting the hosts...");
        let native_db = fixtures::install(&run.template, &run.work.join("native"))?;
        let app_state = run.app_state();
        fixtures::install(&run.template, &app_state)?;
        let app = HostProcess::start(&run.app_spec(&app_state))?;
        let app_token = capacity_manager_token(&app.base)?;
        let tuned_state = run.tuned_state();
        let tuned = if run.cli.no_tuned {
            None
        } else {
            fixtures::install(&run.template, &tuned_state)?;
            let spec = HostSpec {
                sqlite_mode: Some("tuned"),
                ..run.app_spec(&tuned_state)
            };
            let host = HostProcess::start(&spec)?;
            let token = capacity_manager_token(&host.base)?;
            Some((host, token))
        };
        let watched = if run.cli.no_watched {
            None
        } else {
            let receiver =
                api_support::otlp::Receiver::start(api_support::otlp::Protocol::HttpProtobuf);
            let watched_state = run.work.join("watched-state");
            fixtures::install(&run.template, &watched_state)?;
            let mut spec = run.app_spec(&watched_state);
            spec.env
                .push(("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()));
            let host = HostProcess::start(&spec)?;
            let token = capacity_manager_token(&host.base)?;
            Some((host, token, receiver))
        };
        Ok(AppHosts {
            app,
            app_token,
            tuned,
            watched,
            native_db,
        })
    }
}

/// A workload over HTTP against `host`, the CPU column the host's.
fn over_http<'a>(host: &HostProcess, token: Option<&str>) -> Box<Workload<'a>> {
    let (base, pid) = (host.base.clone(), host.pid());
    let token = token.map(str::to_owned);
    Box::new(move |target: &Target<'_>, c: usize, timing: Timing| {
        load::run(
            Server::Process(pid),
            c,
            timing,
            |_| HttpWorker::new(&base, token.as_deref()),
            |w| w.run(target),
        )
    })
}

/// A workload whose clients spread over the replicas; the CPU column is replica 0's alone.
fn spread_over<'a>(deployment: &shared::SharedDeployment, token: &str) -> Box<Workload<'a>> {
    let (bases, pid) = (deployment.bases(), deployment.replicas[0].pid());
    let token = token.to_owned();
    Box::new(move |target: &Target<'_>, c: usize, timing: Timing| {
        load::run(
            Server::Process(pid),
            c,
            timing,
            |i| HttpWorker::new(&bases[i % bases.len()], Some(&token)),
            |w| w.run(target),
        )
    })
}

/// Every workload on every side, side by side: the hello probe, the store natively, the app
/// on local files (as Spin runs SQLite, and tuned), the `--before` build, and the shared
/// deployment. All hosts run at once (idle, a host costs nothing) and each workload is
/// measured on every side back to back, so a change in the machine's load between workloads
/// hits the app and its baselines alike.
fn side_by_side(run: &Run, hosts: &AppHosts, ops: &[Op]) -> anyhow::Result<Vec<Measurement>> {
    let probe_state = run.work.join("probe-state");
    let hello = HostProcess::start(&HostSpec {
        binary: &run.host_bin,
        manifest: &run.probe_manifest,
        state_dir: &probe_state,
        cache_dir: &run.cache_dir,
        env: vec![("SPIN_VARIABLE_API_TOKEN", "bench".to_owned())],
        ready_path: "/hello",
        runtime_config: None,
        sqlite_mode: None,
        log_requests: false,
    })?;
    let before_state = run.work.join("before-state");
    let before = match run.before_build() {
        Some(build) => {
            fixtures::install(&build.template, &before_state)?;
            let spec = app_spec(
                &build.host_bin,
                &build.manifest,
                &before_state,
                &run.cache_dir,
            );
            let host = HostProcess::start(&spec)?;
            let token = capacity_manager_token(&host.base)?;
            Some((host, token))
        }
        None => None,
    };
    let shared = if run.cli.shared_replicas > 0 {
        eprintln!(
            "starting {} replicas on one sqld and one Redis...",
            run.cli.shared_replicas
        );
        let deployment = shared::SharedDeployment::start(
            &run.root,
            &run.template,
            &run.work,
            run.cli.shared_replicas,
            &run.deployment_spec(&run.work),
            Topology::OneSqld {
                rtt: Duration::ZERO,
            },
        )?;
        let token = capacity_manager_token(&deployment.replicas[0].base)?;
        Some((deployment, token))
    } else {
        None
    };
    let native_db = &hosts.native_db;
    let native = |target: &Target<'_>, c: usize, timing: Timing| {
        load::run(
            Server::ThisProcess,
            c,
            timing,
            |_| NativeWorker::open(native_db),
            |w| w.run(target),
        )
    };
    let groups: Vec<Vec<Op>> = [
        vec![Op::Release, Op::Reclaim],
        vec![Op::ReclaimNotice],
        vec![Op::DryRun],
        vec![Op::Get],
        vec![Op::Market],
        vec![Op::Events],
    ]
    .into_iter()
    .map(|group| group.into_iter().filter(|op| ops.contains(op)).collect())
    .filter(|group: &Vec<Op>| !group.is_empty())
    .collect();
    let smallest = run.smallest();
    let mut measurements = Vec::new();
    for &c in &run.cli.concurrency {
        eprintln!("concurrency {c}...");
        let hello_target = Target::new(
            Op::Hello,
            "",
            Units::Fixed(String::new()),
            Representation::Full,
        );
        let stats = over_http(&hello, None)(&hello_target, c, run.timing);
        measurements.push(Measurement::new(Side::Hello, Op::Hello, stats));
        for group in &groups {
            let mut sides: Vec<(Side, Box<Workload<'_>>)> = vec![
                (Side::Native, Box::new(native)),
                (Side::Host, over_http(&hosts.app, Some(&hosts.app_token))),
            ];
            if let Some((host, token)) = &hosts.tuned {
                sides.push((Side::Tuned, over_http(host, Some(token))));
            }
            if let Some((host, token)) = &before {
                sides.push((Side::Before, over_http(host, Some(token))));
            }
            if let Some((deployment, token)) = &shared {
                sides.push((Side::Shared, spread_over(deployment, token)));
            }
            for (side, workload) in &sides {
                for (op, stats) in throughput(group, c, run.timing, &smallest, workload) {
                    measurements.push(Measurement::new(*side, op, stats));
                }
            }
        }
    }
    Ok(measurements)
}

/// The cost of watching: the same app, exporting nothing and exporting its traces, metrics
/// and logs to a receiver on loopback, measured in alternate rounds (the machine's drift
/// falls on both alike) on a release and a GET.
fn watching_cost(run: &Run, hosts: &AppHosts) -> Vec<report::WatchingPoint> {
    let Some((watched, token, _receiver)) = &hosts.watched else {
        return Vec::new();
    };
    eprintln!("the cost of watching...");
    let off = over_http(&hosts.app, Some(&hosts.app_token));
    let on = over_http(watched, Some(token));
    let smallest = run.smallest();
    let mut points = Vec::new();
    for &c in &run.cli.concurrency {
        for op in [Op::Release, Op::Get] {
            let mut point = report::WatchingPoint::new(op, c);
            for round in 0..run.cli.watching_rounds {
                let order = match round % 2 {
                    0 => [false, true],
                    _ => [true, false],
                };
                for exporting in order {
                    let workload = if exporting { &on } else { &off };
                    for (measured, stats) in throughput(&[op], c, run.timing, &smallest, workload) {
                        if measured == op {
                            point.add(exporting, stats);
                        }
                    }
                }
            }
            points.push(point);
        }
    }
    points
}

/// `--rtt-ms`: releases and the reclaims that put the units back on a shared deployment
/// behind a network of that round trip, every writer on its own unit of one node's
/// reservation (hot) and spread over 32 nodes.
fn rtt_curve(run: &Run, ops: &[Op]) -> anyhow::Result<Vec<report::RttPoint>> {
    let mut points = Vec::new();
    let write_ops: Vec<Op> = [Op::Release, Op::Reclaim]
        .into_iter()
        .filter(|op| ops.contains(op))
        .collect();
    if run.cli.shared_replicas == 0 || write_ops.is_empty() {
        return Ok(points);
    }
    let smallest = run.smallest();
    let builds = run.builds();
    for &rtt_ms in &run.cli.rtt_ms {
        // Each build on a deployment of its own, one after the other at each round trip, so
        // that a change in the machine's load hits both alike.
        for build in &builds {
            eprintln!(
                "RTT curve: {rtt_ms} ms round trip to sqld, {} replicas, {} build...",
                run.cli.shared_replicas, build.name
            );
            let deployment = shared::SharedDeployment::start(
                &run.root,
                &build.template,
                &run.work.join(format!("rtt-{rtt_ms}-{}", build.name)),
                run.cli.shared_replicas,
                &build.deployment_spec(run),
                Topology::OneSqld {
                    rtt: Duration::from_millis(rtt_ms),
                },
            )?;
            let token = capacity_manager_token(&deployment.replicas[0].base)?;
            for &c in &run.cli.concurrency {
                for nodes in [SPREAD_NODES, 1] {
                    let workload = spread_over(&deployment, &token);
                    let measured =
                        throughput_on(&write_ops, c, run.timing, &smallest, nodes > 1, &workload);
                    for (op, stats) in measured {
                        points.push(report::RttPoint {
                            build: build.name,
                            rtt_ms,
                            nodes,
                            op,
                            stats,
                        });
                    }
                }
            }
        }
    }
    Ok(points)
}

/// Sites and app replicas per site of `--edge-rtt-ms`.
const EDGE_SITES: usize = 2;
const EDGE_REPLICAS_PER_SITE: usize = 2;

/// `--edge-rtt-ms`: at each round trip, the far primary (every replica on the primary across
/// the network), the sites (each site's replicas on its own read replica, the replica and the
/// home across the network) and the far app (every replica on the primary across the network,
/// its writes sent to the home), one after the other: releases and reclaims spread over 32
/// nodes and GETs at concurrency 1, and the writes at 32; the CPU column is the primary's; at
/// sites, the replication lag to the second site while the writes at 32 run, the connections
/// to the home per request, and (this build) the first write after those went idle.
#[allow(clippy::type_complexity)]
fn edge_curve(
    run: &Run,
) -> anyhow::Result<(
    Vec<report::EdgePoint>,
    Vec<report::EdgeLag>,
    Vec<report::EdgeColdWrite>,
)> {
    let (mut points, mut lags, mut cold_writes) = (Vec::new(), Vec::new(), Vec::new());
    let smallest = run.smallest();
    let writes = [Op::Release, Op::Reclaim];
    let builds = run.builds();
    for &rtt_ms in &run.cli.edge_rtt_ms {
        let rtt = Duration::from_millis(rtt_ms);
        let layouts = [
            (
                report::EdgeLayout::FarPrimary,
                Topology::OneSqld { rtt },
                EDGE_SITES * EDGE_REPLICAS_PER_SITE,
            ),
            (
                report::EdgeLayout::Sites,
                Topology::Sites {
                    sites: EDGE_SITES,
                    rtt,
                },
                EDGE_REPLICAS_PER_SITE,
            ),
            (
                report::EdgeLayout::FarApp,
                Topology::FarFromHome { rtt },
                EDGE_SITES * EDGE_REPLICAS_PER_SITE,
            ),
        ];
        // Each build on a deployment of its own, one after the other, as in the RTT curve.
        for ((layout, topology, replicas), build) in layouts
            .into_iter()
            .flat_map(|layout| builds.iter().map(move |build| (layout, build)))
        {
            eprintln!(
                "edge: {} at {rtt_ms} ms round trip, {} build...",
                layout.name(),
                build.name
            );
            let work = run.work.join(format!(
                "edge-{rtt_ms}-{}-{}",
                layout.name().replace(' ', "-"),
                build.name
            ));
            let deployment = shared::SharedDeployment::start(
                &run.root,
                &build.template,
                &work,
                replicas,
                &build.deployment_spec(run),
                topology,
            )?;
            let token = capacity_manager_token(&deployment.replicas[0].base)?;
            await_key_everywhere(&deployment, &token)?;
            let workload =
                spread_measuring(&deployment, &token, Server::Process(deployment.primary_pid));
            // One op at a time, so that the connections counted are its own.
            for op in [Op::Release, Op::Reclaim, Op::Get] {
                let before = deployment.home_connections();
                let measured = throughput_on(&[op], 1, run.timing, &smallest, true, &workload);
                let opened = deployment
                    .home_connections()
                    .zip(before)
                    .map(|(after, before)| after - before);
                for (op, stats) in measured {
                    points.push(report::EdgePoint {
                        build: build.name,
                        layout,
                        rtt_ms,
                        op,
                        concurrency: 1,
                        stats,
                        home_connections: opened,
                    });
                }
            }
            if build.name == "this" && layout != report::EdgeLayout::FarPrimary {
                cold_writes.push(cold_write(&deployment, &token, build.name, layout, rtt_ms));
            }
            let stop = AtomicBool::new(false);
            let far_site = deployment.site_urls.last().cloned();
            let (measured, samples) = std::thread::scope(|scope| {
                let sampler = far_site.map(|site| {
                    let (primary, stop) = (deployment.primary_url.clone(), &stop);
                    scope.spawn(move || replication_lag(&primary, &site, stop))
                });
                let before = deployment.home_connections();
                let measured = throughput_on(&writes, 32, run.timing, &smallest, true, &workload);
                stop.store(true, Ordering::SeqCst);
                let opened = deployment
                    .home_connections()
                    .zip(before)
                    .map(|(after, before)| after - before);
                (
                    (measured, opened),
                    sampler.map(|s| s.join().expect("the lag sampler")),
                )
            });
            let (measured, opened) = measured;
            let requests: usize = measured.iter().map(|(_, s)| s.requests).sum();
            for (op, stats) in measured {
                // The connections of the two ops at once, shared out by their requests.
                let share = opened.map(|n| {
                    (n as f64 * stats.requests as f64 / requests.max(1) as f64).round() as u64
                });
                points.push(report::EdgePoint {
                    build: build.name,
                    layout,
                    rtt_ms,
                    op,
                    concurrency: 32,
                    stats,
                    home_connections: share,
                });
            }
            if let Some(samples) = samples {
                lags.push(report::EdgeLag {
                    build: build.name,
                    rtt_ms,
                    samples,
                });
            }
        }
    }
    Ok((points, lags, cold_writes))
}

/// How long the pool keeps an idle connection (hyper's default, which Spin keeps).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// The first write (a reclaim) after every connection to the home went idle past the pool's
/// timeout: the handshake to the home paid again.
fn cold_write(
    deployment: &shared::SharedDeployment,
    token: &str,
    build: &'static str,
    layout: report::EdgeLayout,
    rtt_ms: u64,
) -> report::EdgeColdWrite {
    eprintln!("edge: waiting {POOL_IDLE:?} and a second for the pool to drop its connections...");
    std::thread::sleep(POOL_IDLE + Duration::from_secs(1));
    let connections = || deployment.home_connections().unwrap_or(0);
    let before = connections();
    let next = AtomicUsize::new(0);
    let target = Target::new(
        Op::Reclaim,
        &spread_node(0),
        Units::Spread {
            next: &next,
            limit: SPREAD_NODES * SPREAD_UNITS,
        },
        Representation::Full,
    );
    let worker = HttpWorker::new(&deployment.replicas[0].base, Some(token));
    let started = std::time::Instant::now();
    let _ = worker.run(&target);
    report::EdgeColdWrite {
        build,
        layout,
        rtt_ms,
        elapsed: started.elapsed(),
        home_connections: connections() - before,
    }
}

/// Waits until every replica knows the key `token` (at sites, until the key has replicated).
fn await_key_everywhere(deployment: &shared::SharedDeployment, token: &str) -> anyhow::Result<()> {
    for base in deployment.bases() {
        let client = api_client::Client::new(&base, Some(token.to_owned())).without_contract();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while client.get("/v1/whoami").status != 200 {
            if std::time::Instant::now() > deadline {
                bail!("the benchmark's key never reached {base}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// A workload whose clients spread over the replicas, the CPU column `server`'s.
fn spread_measuring<'a>(
    deployment: &shared::SharedDeployment,
    token: &str,
    server: Server,
) -> Box<Workload<'a>> {
    let bases = deployment.bases();
    let token = token.to_owned();
    Box::new(move |target: &Target<'_>, c: usize, timing: Timing| {
        load::run(
            server,
            c,
            timing,
            |i| HttpWorker::new(&bases[i % bases.len()], Some(&token)),
            |w| w.run(target),
        )
    })
}

/// Until `stop`: how long the read replica at `site` takes to reach the position the primary
/// has when asked (both asked directly, over loopback), sampled every 50 ms.
fn replication_lag(primary: &str, site: &str, stop: &AtomicBool) -> Vec<Duration> {
    let position = |url: &str| -> Option<i64> {
        let body = json!({ "requests": [{ "type": "execute", "stmt": {
            "sql": "SELECT COALESCE(MAX(seq), 0) FROM audit_events" } }] });
        let reply = api_client::Client::new(url, None)
            .without_contract()
            .try_send(
                "POST",
                "/v2/pipeline",
                Some("application/json"),
                Some(body.to_string().as_bytes()),
            )
            .ok()?;
        let value: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
        value["results"][0]["response"]["result"]["rows"][0][0]["value"]
            .as_str()?
            .parse()
            .ok()
    };
    let mut samples = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let Some(target) = position(primary) else {
            continue;
        };
        let asked = std::time::Instant::now();
        while position(site).is_none_or(|at| at < target) {
            if asked.elapsed() > Duration::from_secs(30) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push(asked.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    samples
}

/// The scale curve, natively and through the app's host (unless `--no-scale`).
fn scale_points(run: &Run, hosts: &AppHosts) -> Vec<ScalePoint> {
    if run.cli.no_scale {
        return Vec::new();
    }
    eprintln!("scale curve...");
    let worker = NativeWorker::open(&hosts.native_db);
    let native = scale_curve(&run.scales, &run.cli, Server::ThisThread, |target| {
        worker.run(target)
    });
    let mut points: Vec<ScalePoint> = native.into_iter().map(|p| p.on(Side::Native)).collect();
    let client = HttpWorker::new(&hosts.app.base, Some(&hosts.app_token));
    let server = Server::Process(hosts.app.pid());
    points.extend(scale_curve(&run.scales, &run.cli, server, |target| {
        client.run(target)
    }));
    points
}

/// The SQLite statements each request costs, from the request log of a host on each state
/// the throughput left (as Spin runs SQLite, and tuned).
fn statement_counts(run: &Run) -> anyhow::Result<Vec<report::StatementCount>> {
    eprintln!("statements per request...");
    let mut counts = Vec::new();
    let mut modes = vec![("spin", run.app_state())];
    if !run.cli.no_tuned {
        modes.push(("tuned", run.tuned_state()));
    }
    let smallest = run.smallest();
    for (mode, state) in &modes {
        let spec = HostSpec {
            sqlite_mode: Some(mode),
            log_requests: true,
            ..run.app_spec(state)
        };
        for (op, (statements, in_write_transaction)) in count_statements(&spec, &smallest)? {
            counts.push(report::StatementCount {
                mode,
                op,
                statements,
                in_write_transaction,
            });
        }
    }
    Ok(counts)
}

/// What one request of each type costs in SQLite statements, read from the request log of a
/// host started on `spec` (its state left as the measurements left it): release and reclaim
/// of one unit (alternating, `Prefer: return=minimal`), a dry run, and a GET of the smallest
/// reservation. Every request of a type must cost the same; the count is `(all, under the
/// write lock)`.
fn count_statements(spec: &HostSpec<'_>, get_node: &str) -> anyhow::Result<Vec<(Op, (u64, u64))>> {
    const ROUNDS: usize = 5;
    let host = HostProcess::start(spec)?;
    let token = capacity_manager_token(&host.base)?;
    let client = HttpWorker::new(&host.base, Some(&token));
    let unit = || Units::Fixed(unit_id(0));
    let targets = [
        Target::new(
            Op::Release,
            THROUGHPUT_NODE,
            unit(),
            Representation::Minimal,
        ),
        Target::new(
            Op::Reclaim,
            THROUGHPUT_NODE,
            unit(),
            Representation::Minimal,
        ),
        Target::new(Op::DryRun, THROUGHPUT_NODE, unit(), Representation::Minimal),
        Target::new(
            Op::Get,
            get_node,
            Units::Fixed(String::new()),
            Representation::Full,
        ),
    ];
    for _ in 0..ROUNDS {
        for target in &targets {
            if let Step::Failed(message) = client.run(target) {
                bail!(
                    "{} failed while counting statements: {message}",
                    target.op.name()
                );
            }
        }
    }
    // The line of a request is written once its component has finished; give the last one
    // a moment.
    std::thread::sleep(Duration::from_millis(200));
    drop(host);
    let log = std::fs::read_to_string(spec.state_dir.join("host.log"))?;
    let mut out = Vec::new();
    for target in &targets {
        let counts: Vec<(u64, u64)> = log
            .lines()
            .filter(|line| request_op(line) == Some(target.op))
            .filter_map(statements_of)
            .collect();
        let Some(&first) = counts.first() else {
            bail!("no request log line for {}", target.op.name());
        };
        if counts.iter().any(|&c| c != first) {
            bail!(
                "{} cost different statement counts: {counts:?}",
                target.op.name()
            );
        }
        out.push((target.op, first));
    }
    Ok(out)
}

/// Which measured request a request log line is about.
fn request_op(line: &str) -> Option<Op> {
    let mut fields = line.split(' ');
    let (method, path) = (fields.next()?, fields.next()?);
    let path = path.strip_prefix("/v1/nodes/")?;
    match method {
        "POST" if path.ends_with("/reclaim/dry-run") => Some(Op::DryRun),
        "POST" if path.ends_with("/reclaim") => Some(Op::Reclaim),
        "POST" if path.ends_with("/release") => Some(Op::Release),
        "GET" if path.split('/').count() == 3 && path.contains("/reservations/") => Some(Op::Get),
        _ => None,
    }
}

/// `(statements, in_write_tx)` of a request log line.
fn statements_of(line: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|n| n.parse().ok())
    };
    Some((field("statements=")?, field("in_write_tx=")?))
}

/// A capacity-manager key of the owner org, made through the API.
fn capacity_manager_token(base: &str) -> anyhow::Result<String> {
    let operator = HttpWorker::new(base, Some(OPERATOR_TOKEN));
    let (status, body) = operator.post_json(
        &format!("/v1/orgs/{}/keys", fixtures::OWNER_ORG),
        &json!({ "name": "bench", "role": "capacity-manager" }),
    )?;
    if status != 201 {
        bail!("creating the benchmark's key answered {status}: {body}");
    }
    let created: serde_json::Value = serde_json::from_str(&body)?;
    created["token"]
        .as_str()
        .map(str::to_owned)
        .context("the created key has no token")
}

/// Release (fresh units), reclaim (the same units back), dry run and GET at concurrency `c`,
/// those of them that are in `ops`.
fn throughput(
    ops: &[Op],
    c: usize,
    timing: Timing,
    get_node: &str,
    run: &Workload<'_>,
) -> Vec<(Op, Stats)> {
    throughput_on(ops, c, timing, get_node, false, run)
}

/// [`throughput`], the releases and reclaims on one node's reservation (every writer on the
/// same facts) or, with `spread`, each on the next of [`SPREAD_NODES`] nodes.
fn throughput_on(
    ops: &[Op],
    c: usize,
    timing: Timing,
    get_node: &str,
    spread: bool,
    run: &Workload<'_>,
) -> Vec<(Op, Stats)> {
    let (write_node, write_units) = if spread {
        (spread_node(0), SPREAD_NODES * SPREAD_UNITS)
    } else {
        (THROUGHPUT_NODE.to_owned(), THROUGHPUT_UNITS)
    };
    let units = |next, limit| {
        if spread {
            Units::Spread { next, limit }
        } else {
            Units::Sequence { next, limit }
        }
    };
    let mut out = Vec::new();
    if ops.contains(&Op::ReclaimNotice) {
        // Each request takes back a fresh released unit running a spot VM, which gets a
        // deadline; at the second concurrency the units are taken back again, their VMs
        // already under notice (the deadline is kept: the same read and insert).
        let next = AtomicUsize::new(0);
        let notice = Target::new(
            Op::ReclaimNotice,
            NOTICE_NODE,
            Units::Sequence {
                next: &next,
                limit: NOTICE_UNITS,
            },
            Representation::Minimal,
        );
        out.push((Op::ReclaimNotice, run(&notice, c, timing)));
    }
    if ops.contains(&Op::Release) || ops.contains(&Op::Reclaim) {
        let next = AtomicUsize::new(0);
        let release = Target::new(
            Op::Release,
            &write_node,
            units(&next, write_units),
            Representation::Minimal,
        );
        let released_stats = run(&release, c, timing);
        if ops.contains(&Op::Release) {
            out.push((Op::Release, released_stats));
        }
        let released = next.load(Ordering::Relaxed).min(write_units);
        let back = AtomicUsize::new(0);
        let reclaim = Target::new(
            Op::Reclaim,
            &write_node,
            units(&back, released),
            Representation::Minimal,
        );
        // No warm-up of its own: the release pass warmed everything, and a fast reclaim
        // would otherwise spend the released units before the window opens.
        let reclaim_timing = Timing {
            warmup: Duration::ZERO,
            measure: timing.measure,
        };
        let reclaimed_stats = run(&reclaim, c, reclaim_timing);
        if ops.contains(&Op::Reclaim) {
            out.push((Op::Reclaim, reclaimed_stats));
        }
        // Whatever the reclaim pass did not reach goes back too, so the next pass starts clean.
        let leftover = AtomicUsize::new(back.load(Ordering::Relaxed).min(released));
        if leftover.load(Ordering::Relaxed) < released {
            let rest = Target::new(
                Op::Reclaim,
                &write_node,
                units(&leftover, released),
                Representation::Minimal,
            );
            let unbounded = Timing {
                warmup: Duration::ZERO,
                measure: Duration::from_secs(600),
            };
            run(&rest, 1, unbounded);
        }
    }
    if ops.contains(&Op::DryRun) {
        let dry_run = Target::new(
            Op::DryRun,
            THROUGHPUT_NODE,
            Units::Fixed(unit_id(0)),
            Representation::Minimal,
        );
        out.push((Op::DryRun, run(&dry_run, c, timing)));
    }
    if ops.contains(&Op::Get) {
        let get = Target::new(
            Op::Get,
            get_node,
            Units::Fixed(String::new()),
            Representation::Full,
        );
        out.push((Op::Get, run(&get, c, timing)));
    }
    if ops.contains(&Op::Market) {
        let market = Target::new(
            Op::Market,
            MARKET_NODE,
            Units::Fixed(String::new()),
            Representation::Full,
        );
        out.push((Op::Market, run(&market, c, timing)));
    }
    if ops.contains(&Op::Events) {
        let events = Target::new(
            Op::Events,
            THROUGHPUT_NODE,
            Units::Fixed(String::new()),
            Representation::Full,
        );
        out.push((Op::Events, run(&events, c, timing)));
    }
    out
}

/// Release and reclaim of unit 0 and a dry run on unit 1 (which has a VM) of each size's
/// reservation, one request at a time, in both representations. The sizes take turns request
/// by request, so a change in the machine's load hits every size alike; each request's
/// latency and the CPU time the server spent on it are recorded.
fn scale_curve(
    sizes: &[usize],
    cli: &Cli,
    server: Server,
    mut run: impl FnMut(&Target<'_>) -> Step,
) -> Vec<ScalePoint> {
    let mut out = Vec::new();
    for (representation, iterations) in [
        (Representation::Minimal, cli.scale_iterations),
        (Representation::Full, cli.full_iterations),
    ] {
        let nodes: Vec<String> = sizes.iter().map(|&n| scale_node(n)).collect();
        let targets: Vec<(usize, Target<'_>)> = sizes
            .iter()
            .zip(&nodes)
            .flat_map(|(&n, node)| {
                [
                    (
                        n,
                        Target::new(Op::Release, node, Units::Fixed(unit_id(0)), representation),
                    ),
                    (
                        n,
                        Target::new(Op::Reclaim, node, Units::Fixed(unit_id(0)), representation),
                    ),
                    (
                        n,
                        Target::new(Op::DryRun, node, Units::Fixed(unit_id(1)), representation),
                    ),
                ]
            })
            .collect();
        // Release and reclaim alternate, so each changes the unit's state every time.
        let mut latencies = vec![Vec::with_capacity(iterations); targets.len()];
        let mut cpu = vec![Duration::ZERO; targets.len()];
        let mut errors = vec![(0usize, None::<String>); targets.len()];
        let warmup = (iterations / 10).max(2);
        for i in 0..warmup + iterations {
            for (k, (_, target)) in targets.iter().enumerate() {
                let cpu_before = server.cpu_time_precise();
                let began = std::time::Instant::now();
                let step = run(target);
                let took = began.elapsed();
                let cpu_after = server.cpu_time_precise();
                if i < warmup {
                    continue;
                }
                match step {
                    Step::Done => {
                        latencies[k].push(took);
                        if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
                            cpu[k] += b.saturating_sub(a);
                        }
                    }
                    Step::Failed(message) => {
                        errors[k].0 += 1;
                        errors[k].1.get_or_insert(message);
                    }
                    Step::Exhausted => {}
                }
            }
        }
        for (((&(n, ref target), latencies), cpu), (errors, first_error)) in
            targets.iter().zip(latencies).zip(cpu).zip(errors)
        {
            let window = latencies.iter().sum();
            let requests = latencies.len();
            let mut stats = Stats::from_latencies(1, latencies, errors, first_error, window);
            if requests > 0 {
                stats.cpu_us_per_request = Some(cpu.as_secs_f64() * 1e6 / requests as f64);
            }
            out.push(ScalePoint::new(
                Side::Host,
                target.op,
                representation,
                n,
                stats,
            ));
        }
    }
    out
}

/// Serves a stream of `ops` on one unit at concurrency 1 under `perf record` attached to
/// the host.
fn profile(
    host: &HostSpec<'_>,
    template: &Path,
    out_dir: &Path,
    seconds: f64,
    ops: &[Op],
) -> anyhow::Result<()> {
    let state = host.state_dir.join("profile-state");
    fixtures::install(template, &state)?;
    let mut spec = HostSpec {
        state_dir: &state,
        env: host.env.clone(),
        ..*host
    };
    // Names the guests' functions in the profile.
    spec.env.push(("SPIN_HOST_PROFILER", "perfmap".to_owned()));
    let host = HostProcess::start(&spec)?;
    let token = capacity_manager_token(&host.base)?;
    let client = HttpWorker::new(&host.base, Some(&token));
    let pair: Vec<Target<'_>> = ops
        .iter()
        .map(|&op| {
            Target::new(
                op,
                THROUGHPUT_NODE,
                Units::Fixed(unit_id(0)),
                Representation::Minimal,
            )
        })
        .collect();
    // Warm the instance pool and the connection pool first.
    for _ in 0..200 {
        for target in &pair {
            client.run(target);
        }
    }
    let data = out_dir.join("perf.data");
    let mut perf = std::process::Command::new("perf")
        // DWARF unwinding: SQLite's C code has no frame pointers, and with `-g` its time
        // lands on the wrong callers (the schema parse of each new connection hides there).
        .args(["record", "-F", "999", "--call-graph", "dwarf,16384", "-o"])
        .arg(&data)
        .arg("-p")
        .arg(host.pid().to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("cannot run perf (is it installed?)")?;
    std::thread::sleep(Duration::from_millis(500));
    let stats = load::sequential(0, usize::MAX, {
        let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
        let mut i = 0usize;
        move || {
            if std::time::Instant::now() >= deadline {
                return Step::Exhausted;
            }
            i += 1;
            client.run(&pair[i % pair.len()])
        }
    });
    // perf writes its data on SIGINT; it is our own child.
    let _ = std::process::Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status();
    perf.wait()?;
    drop(host);
    eprintln!(
        "profiled {} requests: p50 {:.3} ms, {:.0}/s",
        stats.requests, stats.p50_ms, stats.rps
    );
    let report = std::process::Command::new("perf")
        .args([
            "report",
            // Per function: the time under it (callees included), then its own.
            "--children",
            "--sort",
            "sym",
            "-g",
            "none",
            "--percent-limit",
            "2",
            "--stdio",
            "-i",
        ])
        .arg(&data)
        .output()?;
    let text = out_dir.join("perf.txt");
    std::fs::write(&text, &report.stdout)?;
    eprintln!("wrote {} and {}", data.display(), text.display());
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn git_commit(root: &Path) -> Option<String> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
