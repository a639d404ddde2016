//! Writes beyond one primary (`gpu-bench --cells 1,2,4`): the market in S cells, each its own
//! sqld primary behind a TCP-level delay (`--cells-rtt-ms`, every new connection pays its
//! handshake, as a far primary does), `--cells-replicas` app replicas on them all, and
//! `--cells-writers` clients each releasing and reclaiming a unit of its own node (`Prefer:
//! return=minimal`), the nodes spread over the cells by their ids. For each S (one after the
//! other, in one run): writes/s, each primary's CPU per write and how busy the busiest primary
//! was, what one primary carries (writes/s over its busiest share of a core) and the projection
//! for S primaries on cores of their own; then, the writers stopped, the p50 of a page of each
//! listing that spans cells (market, audit, feed), one request at a time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use api_client::Client;
use api_support::link::Link;
use api_support::stores::RuntimeConfig;
use reservations_store::cells::Cells;
use serde_json::json;

use crate::host::{HostProcess, OPERATOR_TOKEN, app_spec, workspace};
use crate::shared::{self, free_port};

/// What to measure (`gpu-bench --help` has the flags).
pub struct Options {
    /// The numbers of cells to measure, one after the other.
    pub cells: Vec<usize>,
    /// Concurrent writers, each on a node of its own.
    pub writers: usize,
    /// App replicas, on every cell.
    pub replicas: usize,
    /// Round trip between the app and each primary, in milliseconds.
    pub rtt_ms: u64,
    /// Measured seconds of writes per number of cells (after a warm-up of a fifth of it).
    pub seconds: f64,
    /// Requests of each listing, one at a time, after the writes.
    pub listings: usize,
}

/// The listings that span cells, a page of each.
const LISTINGS: [(&str, &str); 3] = [
    ("market page", "/v1/market?limit=50"),
    ("audit page", "/v1/audit?limit=50"),
    ("feed page", "/v1/events?after=p0&limit=50"),
];

/// A cell's sqld primary, reached over `link` (the app's far link) and `grpc` (its site
/// replica's), and that replica, at the site beside the site's app.
struct Cell {
    primary: Server,
    link: Link,
    grpc: Link,
    replica: Server,
}

/// A sqld process and its HTTP port.
struct Server {
    process: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A process's CPU time so far (user + system), from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// A cell's primary with its data in `dir`, behind links without delay until the schema is in
/// place (a migration is one transaction of a hundred statements, which sqld times out at 5 s
/// when each is a round trip to a far primary): a deployment migrates from beside its
/// primary. Then its replica at the site, which follows it over the gRPC link.
fn start_cell(sqld: &Path, dir: &Path) -> anyhow::Result<Cell> {
    let grpc_port = free_port()?;
    let grpc_addr = format!("127.0.0.1:{grpc_port}");
    let primary = start_sqld(sqld, dir, &["--grpc-listen-addr", &grpc_addr])?;
    let link = Link::start(primary.port, Duration::ZERO)?;
    let grpc = Link::start(grpc_port, Duration::ZERO)?;
    let replica = start_sqld(
        sqld,
        &dir.with_file_name(format!(
            "{}-site",
            dir.file_name().unwrap_or_default().display()
        )),
        &["--primary-grpc-url", &grpc.url()],
    )?;
    Ok(Cell {
        primary,
        link,
        grpc,
        replica,
    })
}

/// sqld with its data in `dir`, as deployed (deploy/sqld.yaml's flags), and `role`'s flags.
fn start_sqld(sqld: &Path, dir: &Path, role: &[&str]) -> anyhow::Result<Server> {
    std::fs::create_dir_all(dir)?;
    let role: Vec<String> = role.iter().map(|arg| (*arg).to_owned()).collect();
    let (process, port) = shared::start_sqld(sqld, dir, &dir.with_extension("log"), &role)?;
    Ok(Server { process, port })
}

struct Measured {
    cells: usize,
    writes: u64,
    refused: u64,
    seconds: f64,
    /// Each primary's CPU over the measured seconds, and its writes.
    primaries: Vec<(Duration, u64)>,
    /// The median time of each of [`LISTINGS`], through an app far from the primaries.
    listing_p50s: Vec<Duration>,
    /// The same through an app at a site, on each cell's replica there.
    site_listing_p50s: Vec<Duration>,
}

fn measure(cli: &Options, cells: usize, work: &Path) -> anyhow::Result<Measured> {
    let root = workspace();
    let dir = work.join(format!("cells-{cells}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let sqld = std::env::var_os("SQLD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/stores/bin/sqld"));
    let layout = Cells::new(cells).context("1 to 64 cells")?;
    let rtt = Duration::from_millis(cli.rtt_ms);
    let servers = layout
        .all()
        .map(|cell| start_cell(&sqld, &dir.join(cell.label())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runtime_config = dir.join("runtime-config.toml");
    let site_config = dir.join("runtime-config.site.toml");
    let (at_primaries, at_site) = layout.all().zip(&servers).fold(
        (RuntimeConfig::default(), RuntimeConfig::default()),
        |(far, site), (cell, server)| {
            let replica = format!("http://127.0.0.1:{}", server.replica.port);
            (
                far.libsql_database(&cell.label(), &server.link.url()),
                site.libsql_database(&cell.label(), &replica),
            )
        },
    );
    at_primaries.write(&runtime_config);
    at_site.write(&site_config);
    let manifest = dir.join("spin.toml");
    let status = Command::new("python3")
        .arg(root.join("scripts/cells-manifest"))
        .arg(cells.to_string())
        .arg(&manifest)
        .status()?;
    anyhow::ensure!(status.success(), "scripts/cells-manifest failed");
    let binary = root.join("target/release/spin-host");
    let cache = work.join("cache");
    let replicas = (0..cli.replicas)
        .map(|i| {
            let state = dir.join(format!("replica-{i}"));
            let mut spec = app_spec(&binary, &manifest, &state, &cache);
            spec.runtime_config = Some(&runtime_config);
            HostProcess::start(&spec)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The schema is in place (each replica's health migrated it): now the primaries are far,
    // from the app and from the site.
    for server in &servers {
        server.link.set_rtt(rtt);
        server.grpc.set_rtt(rtt);
    }
    let operator =
        Client::new(&replicas[0].base, Some(OPERATOR_TOKEN.to_owned())).without_contract();
    for org in ["owner", "tenant"] {
        operator
            .post("/v1/orgs", &json!({ "id": org, "name": org }))
            .expect_status(201);
    }
    let key = operator
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "writers", "role": "capacity-manager" }),
        )
        .expect_status(201)
        .json()["token"]
        .as_str()
        .context("a token")?
        .to_owned();
    let nodes: Vec<(String, String)> = (0..cli.writers)
        .map(|i| {
            let node = format!("cw-{i}");
            operator
                .put(
                    &format!("/v1/nodes/{node}"),
                    &json!({ "ownerOrgId": "owner", "unitIds": ["g0"] }),
                )
                .expect_status(201);
            let reservation = operator
                .post(
                    &format!("/v1/nodes/{node}/reservations"),
                    &json!({
                        "reservedUnitIds": ["g0"], "allowedOrgIds": ["tenant"],
                        "startsAt": "2025-01-01T00:00:00Z",
                    }),
                )
                .expect_status(201)
                .json()["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (
                node.clone(),
                format!("/v1/nodes/{node}/reservations/{reservation}"),
            )
        })
        .collect();
    let writes_per_cell: Vec<AtomicU64> = (0..cells).map(|_| AtomicU64::new(0)).collect();
    let (writes, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let measuring = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let warmup = Duration::from_secs_f64(cli.seconds / 5.0);
    let pids: Vec<u32> = servers.iter().map(|c| c.primary.process.id()).collect();
    let mut cpu_before = Vec::new();
    let mut started = Instant::now();
    std::thread::scope(|scope| {
        for (i, (node, path)) in nodes.iter().enumerate() {
            let client = Client::new(&replicas[i % replicas.len()].base, Some(key.clone()))
                .without_contract()
                .with_header("prefer", "return=minimal");
            let cell = layout.home_of(node).index();
            let (writes, refused, per_cell, measuring, stop) =
                (&writes, &refused, &writes_per_cell[cell], &measuring, &stop);
            scope.spawn(move || {
                for action in ["release", "reclaim"].iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let reply =
                        client.post(&format!("{path}/{action}"), &json!({ "unitIds": ["g0"] }));
                    if measuring.load(Ordering::Relaxed) {
                        match reply.status {
                            200 => {
                                writes.fetch_add(1, Ordering::Relaxed);
                                per_cell.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        std::thread::sleep(warmup);
        cpu_before = pids.iter().map(|pid| cpu_time(*pid)).collect();
        started = Instant::now();
        measuring.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs_f64(cli.seconds));
        measuring.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
    });
    let seconds = started.elapsed().as_secs_f64().min(cli.seconds);
    let primaries_measured = pids
        .iter()
        .zip(&cpu_before)
        .zip(&writes_per_cell)
        .map(|((pid, before), written)| {
            (
                cpu_time(*pid).saturating_sub(*before),
                written.load(Ordering::Relaxed),
            )
        })
        .collect();
    let listing_p50s = LISTINGS
        .iter()
        .map(|(_, path)| median_time(&operator, path, cli.listings))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // An app at the site (its health check opens each cell's replica, which then starts to
    // follow its primary), measured once each cell's copy there has every write of its
    // primary, read from the files: while a replica catches up, sqld answers its reads at
    // the primary.
    let site_state = dir.join("site");
    let mut spec = app_spec(&binary, &manifest, &site_state, &cache);
    spec.runtime_config = Some(&site_config);
    let site = HostProcess::start(&spec)?;
    let at_site = Client::new(&site.base, Some(OPERATOR_TOKEN.to_owned())).without_contract();
    let deadline = Instant::now() + Duration::from_secs(300);
    for cell in layout.all() {
        let primary = position(&dir.join(cell.label()))?;
        while position(&dir.join(format!("{}-site", cell.label())))? < primary {
            if Instant::now() > deadline {
                bail!(
                    "the site's copy of {} did not reach {primary}",
                    cell.label()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let site_listing_p50s = LISTINGS
        .iter()
        .map(|(_, path)| median_time(&at_site, path, cli.listings))
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop(site);
    drop(replicas);
    drop(servers);
    Ok(Measured {
        cells,
        writes: writes.into_inner(),
        refused: refused.into_inner(),
        seconds,
        primaries: primaries_measured,
        listing_p50s,
        site_listing_p50s,
    })
}

/// How far the copy of the sqld with its data in `dir` has come: its newest audit event's
/// position, read from its file (0 before it has one).
fn position(dir: &Path) -> anyhow::Result<i64> {
    let file = dir.join("dbs/default/data");
    if !file.exists() {
        return Ok(0);
    }
    let db =
        rusqlite::Connection::open_with_flags(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    db.busy_timeout(Duration::from_secs(10))?;
    Ok(
        db.query_row("SELECT COALESCE(MAX(seq), 0) FROM audit_events", [], |r| {
            r.get(0)
        })?,
    )
}

/// The median time of `requests` GETs of `path`, one at a time, after a few unmeasured.
fn median_time(client: &Client, path: &str, requests: usize) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(requests);
    for i in 0..requests + 3 {
        let started = Instant::now();
        let reply = client.get(path);
        if reply.status != 200 {
            bail!("{path}: {} {}", reply.status, reply.text());
        }
        if i >= 3 {
            times.push(started.elapsed());
        }
    }
    times.sort();
    Ok(times.get(times.len() / 2).copied().unwrap_or_default())
}

/// Measures each number of cells of `cli.cells`, one after the other, and prints the tables.
pub fn run(cli: &Options) -> anyhow::Result<()> {
    let work = workspace().join("bench-results/cells-work");
    std::fs::create_dir_all(&work)?;
    let mut runs = Vec::new();
    for &cells in &cli.cells {
        let run = measure(cli, cells, &work)?;
        eprintln!(
            "{} cells: {:.0} writes/s ({} refused)",
            run.cells,
            run.writes as f64 / run.seconds,
            run.refused
        );
        runs.push(run);
    }
    println!(
        "{} writers on {} nodes, {} app replicas, {} ms to every primary, {:.0} s each:\n",
        cli.writers, cli.writers, cli.replicas, cli.rtt_ms, cli.seconds
    );
    println!(
        "| cells | writes/s | × one cell | CPU per write, each primary | busiest primary | one primary carries | projected, S primaries on cores of their own |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let base = runs.first().map_or(1.0, |r| r.writes as f64 / r.seconds);
    for run in &runs {
        let rate = run.writes as f64 / run.seconds;
        let per_write: Vec<String> = run
            .primaries
            .iter()
            .map(|(cpu, writes)| {
                format!(
                    "{:.2} ms",
                    cpu.as_secs_f64() * 1000.0 / (*writes).max(1) as f64
                )
            })
            .collect();
        let (busiest_cpu, busiest_writes) = run
            .primaries
            .iter()
            .max_by_key(|(cpu, _)| *cpu)
            .copied()
            .unwrap_or_default();
        let busy = busiest_cpu.as_secs_f64() / run.seconds;
        // What one primary would carry with a core to itself, at the CPU per write measured.
        let carries = busiest_writes as f64 / busiest_cpu.as_secs_f64().max(1e-9);
        println!(
            "| {} | {:.0} | {:.2}× | {} | {:.0} % of a core | {:.0} writes/s | {:.0} writes/s |",
            run.cells,
            rate,
            rate / base,
            per_write.join(", "),
            busy * 100.0,
            carries,
            carries * run.cells as f64
        );
    }
    println!(
        "\nA page of each listing across cells, one request at a time after the writes ({} each), \
         through an app far from the primaries and through an app at a site (each cell's replica \
         beside it):\n",
        cli.listings
    );
    let names: Vec<&str> = LISTINGS.iter().map(|(name, _)| *name).collect();
    println!("| cells | where | {} p50 |", names.join(" p50 | "));
    println!("| --- | --- |{}", " --- |".repeat(names.len()));
    for (place, p50s) in [
        (
            "far primary",
            (|r: &Measured| r.listing_p50s.clone()) as fn(&Measured) -> Vec<Duration>,
        ),
        ("site", |r: &Measured| r.site_listing_p50s.clone()),
    ] {
        let first = runs.first().map(p50s).unwrap_or_default();
        for run in &runs {
            let cells: Vec<String> = p50s(run)
                .iter()
                .zip(&first)
                .map(|(p50, base)| {
                    format!(
                        "{:.1} ms ({:.2}×)",
                        p50.as_secs_f64() * 1000.0,
                        p50.as_secs_f64() / base.as_secs_f64().max(1e-9)
                    )
                })
                .collect();
            println!("| {} | {place} | {} |", run.cells, cells.join(" | "));
        }
    }
    Ok(())
}
