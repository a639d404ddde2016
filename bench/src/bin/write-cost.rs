//! What each kind of write costs the sqld primary: the replication frames it adds to the
//! primary's log (what every read replica must fetch and apply) and the CPU sqld spends on
//! it, against a one-row INSERT sent straight to the same sqld in the same run.
//!
//! Each build (this one, and with `--before DIR` an earlier one: its `spin-host` and a
//! `spin.toml` whose sources point at its `.wasm` files) runs on a fresh sqld primary of its
//! own (no read replica) with one `spin-host` on it over loopback, through Spin's runtime
//! config as `gpu-bench`'s shared deployment starts them. The writes go one at a time over
//! HTTP through the API with real keys:
//!
//! - release of one unit and its reclaim (alternating, `Prefer: return=minimal`), by the
//!   node owner's capacity manager;
//! - a spot VM on a released unit and its termination, by a member of the audience;
//! - a reservation of one unit and its cancel, by the node owner's capacity manager;
//! - a node registration (`PUT /v1/nodes/{id}`, a new node of 8 units) and an org, by the
//!   operator;
//! - the baseline: `INSERT` of one row into a scratch table, sent to sqld directly over Hrana
//!   (`POST /v2/pipeline`).
//!
//! Around each request it reads the size of the primary's replication log
//! (`dbs/default/wallog`: a 64-byte header, then 4 120 bytes a frame, one frame a page) and
//! sqld's CPU time (every thread's `schedstat`). sqld runs with a `--max-log-size` far above
//! what the run writes, so the log is never compacted under it. The kinds take turns, each
//! build's request right after the other's, so that a change in the machine's load hits
//! both alike.
//!
//! It prints a table and writes `bench-results/write-cost.json`.
//!
//! `cargo run --release -p gpu-bench --bin write-cost -- [--before DIR] [--writes N]`

#[allow(dead_code)]
#[path = "../host.rs"]
mod host;
#[allow(dead_code)]
#[path = "../load.rs"]
mod load;
#[allow(dead_code)]
#[path = "../shared.rs"]
mod shared;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use api_client::{Client, Reply};
use clap::Parser;
use reservations_domain::access::Caller;
use reservations_domain::capacity::CapacityAction;
use reservations_domain::reservation::{NewReservation, Term};
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::{Context, Store};
use serde::Serialize;
use serde_json::{Value, json};

use crate::host::{OPERATOR_TOKEN, app_spec, workspace};
use crate::load::Server;
use crate::shared::{SharedDeployment, Topology};

/// A frame of sqld's replication log: a 24-byte header and one 4 096-byte page.
const FRAME_BYTES: u64 = 4_120;
/// sqld compacts its replication log past this many MB: far beyond any run.
const MAX_LOG_SIZE_MB: u64 = 1_000_000;
/// Rounds of every kind before the measured ones (the components' first instances, the
/// connections to sqld).
const WARMUP_ROUNDS: usize = 5;

const OWNER: &str = "owner";
const TENANT: &str = "tenant";
/// A node whose one unit is reserved for the tenant: released and reclaimed in turn.
const CAPACITY_NODE: &str = "wc-capacity";
/// A node whose one unit is reserved for the tenant and released: a spot VM is placed on it
/// and terminated in turn.
const SPOT_NODE: &str = "wc-spot";
/// A node whose one unit is reserved and the reservation cancelled in turn.
const RESERVE_NODE: &str = "wc-reserve";
const UNIT: &str = "u0";
const SCRATCH_TABLE: &str = "write_cost_scratch";

#[derive(Parser, Debug)]
#[command(
    name = "write-cost",
    about = "What each kind of write costs the sqld primary: replication frames and CPU"
)]
struct Cli {
    /// A snapshot of an earlier build to measure in the same run: a directory with
    /// `spin-host` and a `spin.toml` whose sources point at that build's `.wasm` files.
    #[arg(long)]
    before: Option<PathBuf>,
    /// Measured writes of each kind, per build.
    #[arg(long, default_value_t = 200)]
    writes: usize,
    /// This build's host binary [default: target/release/spin-host].
    #[arg(long)]
    host_bin: Option<PathBuf>,
    /// This build's manifest [default: spin.toml of the workspace].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Where to write write-cost.json and scratch state [default: bench-results].
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// A kind of write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    Release,
    Reclaim,
    VmPlace,
    VmTerminate,
    ReservationCreate,
    ReservationCancel,
    NodeRegister,
    OrgCreate,
    /// One row into a scratch table, straight to sqld: the baseline.
    Insert,
}

impl Kind {
    /// Every kind, in the order of a round: each undo right after what it undoes.
    const ALL: [Kind; 9] = [
        Kind::Release,
        Kind::Reclaim,
        Kind::VmPlace,
        Kind::VmTerminate,
        Kind::ReservationCreate,
        Kind::ReservationCancel,
        Kind::NodeRegister,
        Kind::OrgCreate,
        Kind::Insert,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Release => "release (1 unit, minimal)",
            Kind::Reclaim => "reclaim (1 unit, minimal)",
            Kind::VmPlace => "VM placement (spot, 1 unit)",
            Kind::VmTerminate => "VM termination",
            Kind::ReservationCreate => "reservation create (1 unit)",
            Kind::ReservationCancel => "reservation cancel",
            Kind::NodeRegister => "node registration (8 units)",
            Kind::OrgCreate => "org creation",
            Kind::Insert => "one-row INSERT over Hrana",
        }
    }
}

/// What the writes of one kind on one build added up to.
#[derive(Debug, Clone, Default)]
struct Tally {
    writes: usize,
    log_bytes: u64,
    min_frames: Option<u64>,
    max_frames: u64,
    cpu: Duration,
    /// Growths of the log that were not a whole number of frames.
    partial_frames: usize,
}

impl Tally {
    fn add(&mut self, log_bytes: u64, cpu: Duration) {
        let frames = log_bytes / FRAME_BYTES;
        if !log_bytes.is_multiple_of(FRAME_BYTES) {
            self.partial_frames += 1;
        }
        self.writes += 1;
        self.log_bytes += log_bytes;
        self.min_frames = Some(self.min_frames.map_or(frames, |m| m.min(frames)));
        self.max_frames = self.max_frames.max(frames);
        self.cpu += cpu;
    }

    fn frames_per_write(&self) -> f64 {
        self.log_bytes_per_write() / FRAME_BYTES as f64
    }

    fn log_bytes_per_write(&self) -> f64 {
        self.log_bytes as f64 / self.writes.max(1) as f64
    }

    fn cpu_us_per_write(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.writes.max(1) as f64
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.writes == 0 {
        bail!("--writes must be at least 1");
    }
    let root = workspace();
    let out_dir = cli
        .out_dir
        .clone()
        .unwrap_or_else(|| root.join("bench-results"));
    let work = out_dir.join("write-cost-work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let template = work.join("template.db");
    build_template(&template)?;

    let mut builds = vec![(
        "this",
        cli.host_bin
            .clone()
            .unwrap_or_else(|| root.join("target/release/spin-host")),
        cli.manifest
            .clone()
            .unwrap_or_else(|| root.join("spin.toml")),
    )];
    if let Some(dir) = &cli.before {
        builds.push(("before", dir.join("spin-host"), dir.join("spin.toml")));
    }
    let cache_dir = root.join("target/spin-host-cache");
    let mut sides = Vec::new();
    for (name, binary, manifest) in &builds {
        eprintln!("{name} build: a fresh sqld primary, Redis and one spin-host...");
        sides.push(Side::start(
            name,
            &root,
            &template,
            &work.join(name),
            binary,
            manifest,
            &cache_dir,
        )?);
    }

    let load_before = load_average();
    eprintln!(
        "{WARMUP_ROUNDS} warm-up rounds, then {} writes of each kind per build...",
        cli.writes
    );
    let mut tallies = vec![vec![Tally::default(); Kind::ALL.len()]; sides.len()];
    for round in 0..WARMUP_ROUNDS + cli.writes {
        for (k, &kind) in Kind::ALL.iter().enumerate() {
            for (side, tallies) in sides.iter_mut().zip(&mut tallies) {
                let (log_bytes, cpu) = side
                    .measure(kind)
                    .with_context(|| format!("{} on the {} build", kind.name(), side.name))?;
                if round >= WARMUP_ROUNDS {
                    tallies[k].add(log_bytes, cpu);
                }
            }
        }
    }
    let load_after = load_average();

    let rows: Vec<Row> = sides
        .iter()
        .zip(&tallies)
        .flat_map(|(side, tallies)| {
            let insert = &tallies[Kind::ALL.len() - 1];
            Kind::ALL
                .iter()
                .zip(tallies)
                .map(|(&kind, tally)| Row::new(kind, side.name, tally, insert))
                .collect::<Vec<_>>()
        })
        .collect();
    print_table(&rows, &sides, cli.writes);
    for row in rows.iter().filter(|r| r.partial_frames > 0) {
        eprintln!(
            "warning: {} on the {} build grew the log by a part of a frame {} times",
            row.kind.name(),
            row.build,
            row.partial_frames
        );
    }

    let report = json!({
        "commit": git_commit(&root),
        "writesPerKind": cli.writes,
        "warmupRounds": WARMUP_ROUNDS,
        "frameBytes": FRAME_BYTES,
        "maxLogSizeMb": MAX_LOG_SIZE_MB,
        "loadBefore": load_before,
        "loadAfter": load_after,
        "builds": sides.iter().map(|s| json!({
            "build": s.name,
            "hostBinary": s.binary,
            "manifest": s.manifest,
        })).collect::<Vec<_>>(),
        "rows": rows,
    });
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join("write-cost.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("wrote {}", path.display());
    drop(sides);
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// One line of the table and of the JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    kind: Kind,
    build: &'static str,
    writes: usize,
    frames_per_write: f64,
    min_frames: u64,
    max_frames: u64,
    log_bytes_per_write: f64,
    sqld_cpu_us_per_write: f64,
    frames_to_insert: f64,
    cpu_to_insert: f64,
    partial_frames: usize,
}

impl Row {
    fn new(kind: Kind, build: &'static str, tally: &Tally, insert: &Tally) -> Row {
        Row {
            kind,
            build,
            writes: tally.writes,
            frames_per_write: tally.frames_per_write(),
            min_frames: tally.min_frames.unwrap_or(0),
            max_frames: tally.max_frames,
            log_bytes_per_write: tally.log_bytes_per_write(),
            sqld_cpu_us_per_write: tally.cpu_us_per_write(),
            frames_to_insert: tally.frames_per_write() / insert.frames_per_write(),
            cpu_to_insert: tally.cpu_us_per_write() / insert.cpu_us_per_write(),
            partial_frames: tally.partial_frames,
        }
    }
}

fn print_table(rows: &[Row], sides: &[Side], writes: usize) {
    println!(
        "What each kind of write costs the sqld primary ({writes} writes of each kind per build, \
         one at a time; ratios to the one-row INSERT on the same sqld)"
    );
    println!();
    println!(
        "| kind | build | frames/write (min–max) | log bytes/write | sqld CPU µs/write | frames ÷ INSERT | CPU ÷ INSERT |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for &kind in &Kind::ALL {
        for side in sides {
            let Some(row) = rows.iter().find(|r| r.kind == kind && r.build == side.name) else {
                continue;
            };
            println!(
                "| {} | {} | {:.2} ({}–{}) | {:.0} | {:.0} | {:.1}× | {:.1}× |",
                kind.name(),
                row.build,
                row.frames_per_write,
                row.min_frames,
                row.max_frames,
                row.log_bytes_per_write,
                row.sqld_cpu_us_per_write,
                row.frames_to_insert,
                row.cpu_to_insert
            );
        }
    }
}

/// One build on its own sqld primary, with the keys and the state of its writes.
struct Side {
    name: &'static str,
    binary: PathBuf,
    manifest: PathBuf,
    /// sqld, Redis and the host, stopped when the side is dropped.
    _deployment: SharedDeployment,
    sqld: Server,
    wallog: PathBuf,
    operator: Client,
    /// The owner's capacity manager: reservations and cancels.
    owner: Client,
    /// The same key with `Prefer: return=minimal`: releases and reclaims.
    owner_minimal: Client,
    /// A member of the tenant, the reservations' audience: VMs.
    tenant: Client,
    /// sqld itself, over Hrana.
    hrana: Client,
    /// The spot VM placed last and not yet terminated.
    vm: Option<String>,
    /// The reservation created last and not yet cancelled.
    reservation: Option<String>,
    /// Nodes, orgs and scratch rows written so far.
    written: usize,
}

impl Side {
    fn start(
        name: &'static str,
        root: &Path,
        template: &Path,
        work: &Path,
        binary: &Path,
        manifest: &Path,
        cache_dir: &Path,
    ) -> anyhow::Result<Side> {
        let spec = app_spec(binary, manifest, work, cache_dir);
        let deployment = SharedDeployment::start_with(
            root,
            template,
            work,
            1,
            &spec,
            Topology::OneSqld {
                rtt: Duration::ZERO,
            },
            &["--max-log-size".to_owned(), MAX_LOG_SIZE_MB.to_string()],
        )?;
        let base = deployment.replicas[0].base.clone();
        let operator = Client::new(&base, Some(OPERATOR_TOKEN.to_owned())).without_contract();
        let key = |org: &str, role: &str| -> anyhow::Result<Client> {
            let reply = operator.post(
                &format!("/v1/orgs/{org}/keys"),
                &json!({ "name": "write cost", "role": role }),
            );
            let created = expect(reply, 201, "creating a key")?;
            let token = created["token"]
                .as_str()
                .context("the created key has no token")?;
            Ok(Client::new(&base, Some(token.to_owned())).without_contract())
        };
        let owner = key(OWNER, "capacity-manager")?;
        let owner_minimal = owner.with_header("prefer", "return=minimal");
        let tenant = key(TENANT, "member")?;
        let hrana = Client::new(&deployment.primary_url, None).without_contract();
        let side = Side {
            name,
            binary: binary.to_owned(),
            manifest: manifest.to_owned(),
            sqld: Server::Process(deployment.primary_pid),
            wallog: deployment.primary_database.join("wallog"),
            _deployment: deployment,
            operator,
            owner,
            owner_minimal,
            tenant,
            hrana,
            vm: None,
            reservation: None,
            written: 0,
        };
        side.execute(&format!(
            "CREATE TABLE IF NOT EXISTS {SCRATCH_TABLE} (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"
        ))?;
        if !side.wallog.is_file() {
            bail!(
                "sqld has no replication log at {}: is it sqld 0.24 (scripts/stores install)?",
                side.wallog.display()
            );
        }
        Ok(side)
    }

    /// Sends one write of `kind`; how much it grew the replication log, and the CPU sqld
    /// spent meanwhile.
    fn measure(&mut self, kind: Kind) -> anyhow::Result<(u64, Duration)> {
        let log_before = self.log_size()?;
        let cpu_before = self.sqld.cpu_time_precise();
        self.write(kind)?;
        let cpu_after = self.sqld.cpu_time_precise();
        let log_after = self.log_size()?;
        if log_after < log_before {
            bail!(
                "sqld's replication log shrank ({log_before} → {log_after} bytes): it was \
                 compacted under the measurement"
            );
        }
        let cpu = match (cpu_before, cpu_after) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => bail!("cannot read sqld's CPU time from /proc"),
        };
        Ok((log_after - log_before, cpu))
    }

    fn log_size(&self) -> anyhow::Result<u64> {
        Ok(std::fs::metadata(&self.wallog)
            .with_context(|| format!("reading {}", self.wallog.display()))?
            .len())
    }

    fn write(&mut self, kind: Kind) -> anyhow::Result<()> {
        let capacity = |action: &str| {
            format!(
                "/v1/nodes/{CAPACITY_NODE}/reservations/{}/{action}",
                reservation_of(CAPACITY_NODE)
            )
        };
        match kind {
            Kind::Release => {
                let reply = self
                    .owner_minimal
                    .post(&capacity("release"), &json!({ "unitIds": [UNIT] }));
                expect(reply, 200, "release")?;
            }
            Kind::Reclaim => {
                let reply = self
                    .owner_minimal
                    .post(&capacity("reclaim"), &json!({ "unitIds": [UNIT] }));
                expect(reply, 200, "reclaim")?;
            }
            Kind::VmPlace => {
                let reply = self.tenant.post(
                    "/v1/vms",
                    &json!({ "nodeId": SPOT_NODE, "unitIds": [UNIT], "tier": "spot" }),
                );
                self.vm = Some(created_id(expect(reply, 201, "VM placement")?)?);
            }
            Kind::VmTerminate => {
                let vm = self.vm.take().context("no VM to terminate")?;
                expect(
                    self.tenant.delete(&format!("/v1/vms/{vm}")),
                    200,
                    "VM termination",
                )?;
            }
            Kind::ReservationCreate => {
                let reply = self.owner.post(
                    &format!("/v1/nodes/{RESERVE_NODE}/reservations"),
                    &json!({
                        "reservedUnitIds": [UNIT],
                        "allowedOrgIds": [TENANT],
                        "startsAt": "2025-01-01T00:00:00Z",
                    }),
                );
                self.reservation = Some(created_id(expect(reply, 201, "reservation create")?)?);
            }
            Kind::ReservationCancel => {
                let id = self
                    .reservation
                    .take()
                    .context("no reservation to cancel")?;
                let reply = self.owner.post(
                    &format!("/v1/nodes/{RESERVE_NODE}/reservations/{id}/cancel"),
                    &json!({}),
                );
                expect(reply, 200, "reservation cancel")?;
            }
            Kind::NodeRegister => {
                self.written += 1;
                let units: Vec<String> = (0..8).map(|u| format!("gpu-{u}")).collect();
                let reply = self.operator.put(
                    &format!("/v1/nodes/wc-node-{:06}", self.written),
                    &json!({ "ownerOrgId": OWNER, "unitIds": units }),
                );
                expect(reply, 201, "node registration")?;
            }
            Kind::OrgCreate => {
                self.written += 1;
                let reply = self.operator.post(
                    "/v1/orgs",
                    &json!({ "name": format!("Write cost org {}", self.written) }),
                );
                expect(reply, 201, "org creation")?;
            }
            Kind::Insert => {
                self.written += 1;
                self.execute_with(
                    &format!("INSERT INTO {SCRATCH_TABLE} (v) VALUES (?)"),
                    json!([{ "type": "text", "value": format!("row {}", self.written) }]),
                )?;
            }
        }
        Ok(())
    }

    fn execute(&self, sql: &str) -> anyhow::Result<()> {
        self.execute_with(sql, json!([]))
    }

    /// One statement in a pipeline of its own, as a stateless Hrana client sends it.
    fn execute_with(&self, sql: &str, args: Value) -> anyhow::Result<()> {
        let body = json!({ "requests": [
            { "type": "execute", "stmt": { "sql": sql, "args": args } },
            { "type": "close" },
        ] });
        let reply = self
            .hrana
            .try_send(
                "POST",
                "/v2/pipeline",
                Some("application/json"),
                Some(body.to_string().as_bytes()),
            )
            .map_err(|e| anyhow!("sqld: {e}"))?;
        let answer = expect(reply, 200, "sqld's pipeline")?;
        if answer["results"][0]["type"] != "ok" {
            bail!("sqld refused {sql:?}: {answer}");
        }
        Ok(())
    }
}

fn reservation_of(node: &str) -> String {
    format!("r-{node}")
}

/// The JSON body of `reply`, or why the status is not `status`.
fn expect(reply: Reply, status: u16, what: &str) -> anyhow::Result<Value> {
    if reply.status != status {
        bail!(
            "{what} answered {} (expected {status}): {}",
            reply.status,
            reply.text()
        );
    }
    serde_json::from_slice(&reply.body).with_context(|| format!("{what}: a body that is not JSON"))
}

fn created_id(body: Value) -> anyhow::Result<String> {
    body["id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no id in {body}"))
}

/// The orgs, the nodes and the reservations, through the native store into a SQLite file
/// that each sqld gets a copy of.
fn build_template(path: &Path) -> anyhow::Result<()> {
    let fail = |e: reservations_store::StoreError| anyhow!("{e}");
    let db = NativeDb::open(path).map_err(|e| anyhow!("{e}"))?;
    let store = Store::open(&db).map_err(fail)?;
    let operator = Caller::operator("write-cost-setup");
    let now = chrono::Utc::now();
    let ctx = Context::new(&operator, now, "write-cost-setup");
    for org in [OWNER, TENANT] {
        store.identity().create_org(&ctx, org, org).map_err(fail)?;
    }
    let unit = [UNIT.to_owned()];
    for node in [CAPACITY_NODE, SPOT_NODE, RESERVE_NODE] {
        store
            .capacity()
            .put_node(&ctx, node, OWNER, &unit)
            .map_err(fail)?;
    }
    for node in [CAPACITY_NODE, SPOT_NODE] {
        store
            .capacity()
            .create_reservation(
                &ctx,
                node,
                &reservation_of(node),
                &NewReservation {
                    reserved_unit_ids: unit.to_vec(),
                    allowed_org_ids: vec![TENANT.to_owned()],
                    managing_org_ids: Vec::new(),
                    term: Term {
                        starts_at: now - chrono::TimeDelta::hours(1),
                        ends_at: None,
                    },
                    contract_ref: None,
                    reason: None,
                },
            )
            .map_err(fail)?;
    }
    store
        .capacity()
        .change_capacity(
            &ctx,
            CapacityChange {
                action: CapacityAction::Release,
                node_id: SPOT_NODE,
                reservation_id: &reservation_of(SPOT_NODE),
                unit_ids: &unit,
                reason: None,
                representation: Representation::Minimal,
                notice_seconds: None,
                until: None,
            },
        )
        .map_err(fail)?;
    db.connection()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .context("checkpoint")?;
    Ok(())
}

fn git_commit(root: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
