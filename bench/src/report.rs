//! The printed table and the JSON document, with every ratio against baselines measured in
//! the same run.

use std::fmt::Write as _;
use std::time::Duration;

use reservations_store::capacity::Representation;
use serde::Serialize;
use serde_json::{Value, json};

use crate::load::Stats;
use crate::workloads::Op;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// The app through the host over HTTP, SQLite run as Spin runs it.
    Host,
    /// The app through the host over HTTP, SQLite tuned (`--sqlite-mode tuned`).
    Tuned,
    /// The store over rusqlite in process.
    Native,
    /// The hello-world component through the host.
    Hello,
    /// An earlier build of the app through its own host (`--before`).
    Before,
    /// The app on several replicas sharing one sqld and one Redis (`--shared-replicas`).
    Shared,
}

#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub side: Side,
    pub op: Op,
    #[serde(flatten)]
    pub stats: Stats,
}

impl Measurement {
    pub fn new(side: Side, op: Op, stats: Stats) -> Measurement {
        Measurement { side, op, stats }
    }
}

/// One workload measured on the host exporting nothing and on the host exporting.
#[derive(Debug, Clone)]
pub struct WatchingPoint {
    pub op: Op,
    pub concurrency: usize,
    pub off: Vec<Stats>,
    pub on: Vec<Stats>,
}

/// The medians of a side's rounds.
pub struct Medians {
    pub rps: f64,
    pub p50_ms: f64,
    pub cpu_us: f64,
}

impl WatchingPoint {
    pub fn new(op: Op, concurrency: usize) -> WatchingPoint {
        WatchingPoint {
            op,
            concurrency,
            off: Vec::new(),
            on: Vec::new(),
        }
    }

    pub fn add(&mut self, exporting: bool, stats: Stats) {
        match exporting {
            true => self.on.push(stats),
            false => self.off.push(stats),
        }
    }

    pub fn medians(&self, exporting: bool) -> Medians {
        let rounds = if exporting { &self.on } else { &self.off };
        let median = |value: fn(&Stats) -> f64| {
            let mut values: Vec<f64> = rounds.iter().map(value).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
        };
        Medians {
            rps: median(|s| s.rps),
            p50_ms: median(|s| s.p50_ms),
            cpu_us: median(|s| s.cpu_us_per_request.unwrap_or(f64::NAN)),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    pub side: Side,
    pub op: Op,
    pub representation: &'static str,
    pub units: usize,
    #[serde(flatten)]
    pub stats: Stats,
}

impl ScalePoint {
    pub fn new(
        side: Side,
        op: Op,
        representation: Representation,
        units: usize,
        stats: Stats,
    ) -> ScalePoint {
        ScalePoint {
            side,
            op,
            representation: representation_name(representation),
            units,
            stats,
        }
    }
}

impl ScalePoint {
    /// The same point, measured on another side.
    pub fn on(mut self, side: Side) -> ScalePoint {
        self.side = side;
        self
    }
}

fn representation_name(representation: Representation) -> &'static str {
    match representation {
        Representation::Minimal => "minimal",
        Representation::Full => "full",
    }
}

/// What one request of a type costs in SQLite statements under one SQLite mode.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatementCount {
    pub mode: &'static str,
    pub op: Op,
    pub statements: u64,
    pub in_write_transaction: u64,
}

/// A write workload on the shared deployment behind a network of `rtt_ms` round trip.
#[derive(Debug, Clone, Serialize)]
pub struct RttPoint {
    /// `this` build, or the `--before` one.
    pub build: &'static str,
    pub rtt_ms: u64,
    /// How many nodes the writes were spread over (1: every writer on one reservation).
    pub nodes: usize,
    pub op: Op,
    pub stats: Stats,
}

/// Where the app's replicas are in the edge comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeLayout {
    /// Every replica on the primary, across the network.
    FarPrimary,
    /// Each site's replicas on the site's read replica, which is across the network.
    Sites,
    /// Every replica on the primary across the network, its writes sent to the home beside
    /// the primary (no replica of its own).
    FarApp,
}

impl EdgeLayout {
    pub fn name(self) -> &'static str {
        match self {
            EdgeLayout::FarPrimary => "far primary",
            EdgeLayout::Sites => "sites",
            EdgeLayout::FarApp => "far app",
        }
    }
}

/// One workload of the edge comparison; the CPU column is the primary's.
pub struct EdgePoint {
    /// `this` or `before`.
    pub build: &'static str,
    pub layout: EdgeLayout,
    pub rtt_ms: u64,
    pub op: Op,
    pub concurrency: usize,
    pub stats: Stats,
    /// Connections the replicas opened to the home while it ran (where they forward writes).
    pub home_connections: Option<u64>,
}

/// The first write after the connections to the home went idle (past the pool's 90 s).
pub struct EdgeColdWrite {
    pub build: &'static str,
    pub layout: EdgeLayout,
    pub rtt_ms: u64,
    pub elapsed: Duration,
    pub home_connections: u64,
}

/// How long the far site's read replica took to reach the primary's position, sampled while
/// the writes at 32 ran.
pub struct EdgeLag {
    pub build: &'static str,
    pub rtt_ms: u64,
    pub samples: Vec<Duration>,
}

impl EdgeLag {
    /// p50, p99 and max, in milliseconds.
    pub fn percentiles(&self) -> (f64, f64, f64) {
        let mut ms: Vec<f64> = self
            .samples
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        (at(0.5), at(0.99), ms.last().copied().unwrap_or(0.0))
    }
}

pub struct Results {
    pub statement_counts: Vec<StatementCount>,
    pub rtt_points: Vec<RttPoint>,
    pub edge_points: Vec<EdgePoint>,
    pub edge_lags: Vec<EdgeLag>,
    pub edge_cold_writes: Vec<EdgeColdWrite>,
    pub measurements: Vec<Measurement>,
    pub scale_points: Vec<ScalePoint>,
    pub sizes: Vec<(String, u64)>,
    pub cold_start: Vec<(String, Duration)>,
    pub warm_start: Duration,
    /// The cost of watching (`--no-watched` skips it).
    pub watching: Vec<WatchingPoint>,
}

impl Results {
    /// Every measurement with failed requests, as `(what, errors, first error)`: numbers
    /// measured over failures are not numbers of the service, so the run must not pass.
    pub fn failures(&self) -> Vec<(String, usize, Option<String>)> {
        let measurements = self.measurements.iter().map(|m| {
            (
                format!("{:?} {:?} c={}", m.side, m.op, m.stats.concurrency),
                &m.stats,
            )
        });
        let points = self.scale_points.iter().map(|p| {
            (
                format!("{:?} {:?} {} N={}", p.side, p.op, p.representation, p.units),
                &p.stats,
            )
        });
        let rtt = self.rtt_points.iter().map(|p| {
            (
                format!(
                    "RTT {} ms {} nodes {:?} c={} {}",
                    p.rtt_ms, p.nodes, p.op, p.stats.concurrency, p.build
                ),
                &p.stats,
            )
        });
        let edge = self.edge_points.iter().map(|p| {
            (
                format!(
                    "edge {} {} {} ms {:?} c={}",
                    p.build,
                    p.layout.name(),
                    p.rtt_ms,
                    p.op,
                    p.concurrency
                ),
                &p.stats,
            )
        });
        let watching = self.watching.iter().flat_map(|p| {
            let sides = p
                .off
                .iter()
                .map(|s| (false, s))
                .chain(p.on.iter().map(|s| (true, s)));
            sides.map(move |(exporting, stats)| {
                let side = if exporting {
                    "exporting"
                } else {
                    "not exporting"
                };
                (
                    format!("watching {side} {:?} c={}", p.op, p.concurrency),
                    stats,
                )
            })
        });
        measurements
            .chain(points)
            .chain(rtt)
            .chain(edge)
            .chain(watching)
            .filter(|(_, stats)| stats.errors > 0)
            .map(|(what, stats)| (what, stats.errors, stats.first_error.clone()))
            .collect()
    }
}

/// One line of the scale curve.
struct Series {
    side: Side,
    op: Op,
    representation: &'static str,
    /// (units, p50 ms, server CPU µs per request), smallest reservation first.
    points: Vec<(usize, f64, f64)>,
}

impl Series {
    /// The metric at the largest reservation over the metric at the smallest.
    fn largest_over_smallest(&self, metric: impl Fn(&(usize, f64, f64)) -> f64) -> f64 {
        match (self.points.first(), self.points.last()) {
            (Some(first), Some(last)) => metric(last) / metric(first),
            _ => f64::NAN,
        }
    }
}

fn p50_of(point: &(usize, f64, f64)) -> f64 {
    point.1
}

fn cpu_of(point: &(usize, f64, f64)) -> f64 {
    point.2
}

const OPS: [Op; 7] = [
    Op::Release,
    Op::Reclaim,
    Op::ReclaimNotice,
    Op::DryRun,
    Op::Get,
    Op::Market,
    Op::Events,
];

/// One row of the throughput table: the app (on one side) and both baselines at one
/// concurrency.
struct Row<'a> {
    side: Side,
    op: Op,
    concurrency: usize,
    host: &'a Stats,
    native: Option<&'a Stats>,
    hello: Option<&'a Stats>,
    before: Option<&'a Stats>,
}

impl Row<'_> {
    fn json(&self) -> Value {
        let ratio = |a: f64, b: f64| round(a / b, 2);
        let mut row = json!({
            "side": self.side,
            "op": self.op,
            "concurrency": self.concurrency,
            "host": summary(self.host),
        });
        if let Some(native) = self.native {
            row["native"] = summary(native);
            row["p50OverNative"] = json!(ratio(self.host.p50_ms, native.p50_ms));
            row["nativeRpsOverHost"] = json!(ratio(native.rps, self.host.rps));
        }
        if let Some(hello) = self.hello {
            row["hello"] = summary(hello);
            row["p50OverHello"] = json!(ratio(self.host.p50_ms, hello.p50_ms));
            row["helloRpsOverHost"] = json!(ratio(hello.rps, self.host.rps));
        }
        if let Some(before) = self.before {
            row["before"] = summary(before);
            row["rpsAfterOverBefore"] = json!(ratio(self.host.rps, before.rps));
            row["p50BeforeOverAfter"] = json!(ratio(before.p50_ms, self.host.p50_ms));
            row["p99BeforeOverAfter"] = json!(ratio(before.p99_ms, self.host.p99_ms));
            row["meanBeforeOverAfter"] = json!(ratio(before.mean_ms, self.host.mean_ms));
            if let (Some(b), Some(a)) = (before.cpu_us_per_request, self.host.cpu_us_per_request) {
                row["cpuBeforeOverAfter"] = json!(ratio(b, a));
            }
        }
        if let (Some(native), Some(hello)) = (self.native, self.hello) {
            // What is neither the HTTP/instantiation floor nor the storage floor: the Wasm
            // boundary (host calls, copies) and our code (auth, parsing, rendering).
            row["gapMs"] = json!(round(self.host.p50_ms - hello.p50_ms - native.p50_ms, 3));
            if let (Some(h), Some(w), Some(n)) = (
                self.host.cpu_us_per_request,
                hello.cpu_us_per_request,
                native.cpu_us_per_request,
            ) {
                row["gapCpuUs"] = json!(round(h - w - n, 1));
            }
        }
        row
    }
}

/// The numbers of one workload that the tables use.
fn summary(s: &Stats) -> Value {
    json!({
        "rps": round(s.rps, 1),
        "p50Ms": round(s.p50_ms, 3),
        "p99Ms": round(s.p99_ms, 3),
        "meanMs": round(s.mean_ms, 3),
        "cpuUsPerRequest": s.cpu_us_per_request.map(|c| round(c, 1)),
        "requests": s.requests,
        "errors": s.errors,
    })
}

fn round(x: f64, digits: i32) -> f64 {
    let factor = 10f64.powi(digits);
    (x * factor).round() / factor
}

impl Results {
    fn find(&self, side: Side, op: Op, concurrency: usize) -> Option<&Stats> {
        self.measurements
            .iter()
            .find(|m| m.side == side && m.op == op && m.stats.concurrency == concurrency)
            .map(|m| &m.stats)
    }

    fn rows(&self) -> Vec<Row<'_>> {
        let mut levels: Vec<usize> = self
            .measurements
            .iter()
            .map(|m| m.stats.concurrency)
            .collect();
        levels.sort_unstable();
        levels.dedup();
        let mut rows = Vec::new();
        for side in [Side::Host, Side::Tuned] {
            for &c in &levels {
                for op in OPS {
                    if let Some(host) = self.find(side, op, c) {
                        rows.push(Row {
                            side,
                            op,
                            concurrency: c,
                            host,
                            native: self.find(Side::Native, op, c),
                            hello: self.find(Side::Hello, Op::Hello, c),
                            before: (side == Side::Host)
                                .then(|| self.find(Side::Before, op, c))
                                .flatten(),
                        });
                    }
                }
            }
        }
        rows
    }

    fn side_rows(&self, side: Side) -> Vec<Row<'_>> {
        self.rows().into_iter().filter(|r| r.side == side).collect()
    }

    /// The scale points grouped by (side, op, representation), smallest size first.
    fn scale_series(&self) -> Vec<Series> {
        let mut series: Vec<Series> = Vec::new();
        for point in &self.scale_points {
            let measured = (
                point.units,
                point.stats.p50_ms,
                point.stats.cpu_us_per_request.unwrap_or(f64::NAN),
            );
            match series.iter_mut().find(|s| {
                (s.side, s.op, s.representation) == (point.side, point.op, point.representation)
            }) {
                Some(s) => s.points.push(measured),
                None => series.push(Series {
                    side: point.side,
                    op: point.op,
                    representation: point.representation,
                    points: vec![measured],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by_key(|(units, _, _)| *units);
        }
        series
    }

    pub fn json(&self) -> Value {
        json!({
            "throughput": self.rows().iter().map(Row::json).collect::<Vec<_>>(),
            "watching": self.watching.iter().map(|p| {
                let (off, on) = (p.medians(false), p.medians(true));
                json!({
                    "op": p.op, "concurrency": p.concurrency, "rounds": p.off.len(),
                    "offRps": round(off.rps, 1), "offP50Ms": round(off.p50_ms, 3), "offCpuUsPerRequest": round(off.cpu_us, 1),
                    "exportingRps": round(on.rps, 1), "exportingP50Ms": round(on.p50_ms, 3), "exportingCpuUsPerRequest": round(on.cpu_us, 1),
                    "rpsRatio": round(on.rps / off.rps, 3), "p50Ratio": round(on.p50_ms / off.p50_ms, 3), "cpuRatio": round(on.cpu_us / off.cpu_us, 3),
                })
            }).collect::<Vec<_>>(),
            "statementsPerRequest": self.statement_counts,
            "rttCurve": self.rtt_points.iter().map(|p| json!({
                "build": p.build, "rttMs": p.rtt_ms, "nodes": p.nodes, "op": p.op, "concurrency": p.stats.concurrency,
                "rps": round(p.stats.rps, 1), "p50Ms": round(p.stats.p50_ms, 3), "p99Ms": round(p.stats.p99_ms, 3),
                "boundRps": self.write_bound(p).map(|b| round(b, 1)),
            })).collect::<Vec<_>>(),
            "edge": self.edge_points.iter().map(|p| json!({
                "build": p.build, "layout": p.layout.name(), "rttMs": p.rtt_ms, "op": p.op, "concurrency": p.concurrency,
                "rps": round(p.stats.rps, 1), "p50Ms": round(p.stats.p50_ms, 3), "p99Ms": round(p.stats.p99_ms, 3),
                "primaryCpuUsPerRequest": p.stats.cpu_us_per_request.map(|c| round(c, 1)),
            })).collect::<Vec<_>>(),
            "replicationLag": self.edge_lags.iter().map(|l| {
                let (p50, p99, max) = l.percentiles();
                json!({"build": l.build, "rttMs": l.rtt_ms, "samples": l.samples.len(), "p50Ms": round(p50, 2), "p99Ms": round(p99, 2), "maxMs": round(max, 2)})
            }).collect::<Vec<_>>(),
            "measurements": self.measurements,
            "scale": self.scale_series().iter().map(|s| json!({
                "side": s.side, "op": s.op, "representation": s.representation,
                "points": s.points.iter().map(|(units, p50, cpu)| json!({"units": units, "p50Ms": round(*p50, 3), "cpuUsPerRequest": round(*cpu, 1)})).collect::<Vec<_>>(),
                "p50LargestOverSmallest": round(s.largest_over_smallest(p50_of), 2),
                "cpuLargestOverSmallest": round(s.largest_over_smallest(cpu_of), 2),
            })).collect::<Vec<_>>(),
            "scalePoints": self.scale_points,
            "wasmBytes": self.sizes.iter().map(|(name, bytes)| json!({"component": name, "bytes": bytes})).collect::<Vec<_>>(),
            "coldStart": self.cold_start.iter().map(|(what, d)| json!({"start": what, "timeToFirstResponseMs": round(d.as_secs_f64() * 1000.0, 1)})).collect::<Vec<_>>(),
            "benchHostTimeToFirstResponseMs": round(self.warm_start.as_secs_f64() * 1000.0, 1),
        })
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        if !self.statement_counts.is_empty() {
            let _ = writeln!(
                out,
                "\nSQLite statements per request (Prefer: return=minimal), all / inside a write transaction, from the host's request log."
            );
            let _ = writeln!(out, "{:<16} | {:>12} | {:>12}", "op", "spin", "tuned");
            for op in OPS {
                let of = |mode: &str| {
                    self.statement_counts
                        .iter()
                        .find(|c| c.op == op && c.mode == mode)
                        .map(|c| format!("{} / {}", c.statements, c.in_write_transaction))
                        .unwrap_or_else(|| "-".to_owned())
                };
                if self.statement_counts.iter().any(|c| c.op == op) {
                    let _ = writeln!(
                        out,
                        "{:<16} | {:>12} | {:>12}",
                        op.name(),
                        of("spin"),
                        of("tuned")
                    );
                }
            }
        }
        for (side, title) in [
            (
                Side::Host,
                "What users get: the host with SQLite run as Spin runs it (--sqlite-mode spin)",
            ),
            (
                Side::Tuned,
                "The tuned host (--sqlite-mode tuned: pooled connections, inline reads, a writer queue)",
            ),
        ] {
            if self.side_rows(side).is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n== {title} ==");
            self.side_tables(side, &mut out);
        }
        self.spin_over_tuned(&mut out);
        self.watching_table(&mut out);
        self.shared_table(&mut out);
        self.rtt_table(&mut out);
        self.edge_table(&mut out);
        self.rest_of_table(&mut out);
        out
    }

    /// The host exporting its telemetry against the same host exporting nothing.
    fn watching_table(&self, out: &mut String) {
        if self.watching.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nThe cost of watching: the host exporting traces, metrics and logs (OTLP, HTTP/protobuf) to a receiver on loopback, against the host exporting nothing; medians of {} alternate rounds each, in this run.",
            self.watching[0].off.len()
        );
        let _ = writeln!(
            out,
            "{:<16} {:>3} | {:>7} {:>8} {:>7} | {:>9} {:>8} {:>7} | {:>8} {:>8} {:>8}",
            "op",
            "c",
            "off/s",
            "p50 ms",
            "cpu µs",
            "export/s",
            "p50 ms",
            "cpu µs",
            "rps e/o",
            "p50 e/o",
            "cpu e/o"
        );
        for point in &self.watching {
            let (off, on) = (point.medians(false), point.medians(true));
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>7.0} {:>8.3} {:>7.0} | {:>9.0} {:>8.3} {:>7.0} | {:>7.3}x {:>7.3}x {:>7.3}x",
                point.op.name(),
                point.concurrency,
                off.rps,
                off.p50_ms,
                off.cpu_us,
                on.rps,
                on.p50_ms,
                on.cpu_us,
                on.rps / off.rps,
                on.p50_ms / off.p50_ms,
                on.cpu_us / off.cpu_us
            );
        }
    }

    /// Tuned against Spin-like, workload by workload.
    fn spin_over_tuned(&self, out: &mut String) {
        let pairs: Vec<(Row<'_>, Row<'_>)> = self
            .side_rows(Side::Host)
            .into_iter()
            .filter_map(|spin| {
                let tuned = self
                    .side_rows(Side::Tuned)
                    .into_iter()
                    .find(|t| t.op == spin.op && t.concurrency == spin.concurrency)?;
                Some((spin, tuned))
            })
            .collect();
        if pairs.is_empty() {
            return;
        }
        let _ = writeln!(out, "\nSpin-like against tuned, in this run.");
        let _ = writeln!(
            out,
            "{:<16} {:>3} | {:>7} {:>8} | {:>7} {:>8} | {:>9} {:>9}",
            "op", "c", "spin/s", "p99 ms", "tuned/s", "p99 ms", "rps t/s", "p99 s/t"
        );
        for (spin, tuned) in pairs {
            let (s, t) = (spin.host, tuned.host);
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>7.0} {:>8.3} | {:>7.0} {:>8.3} | {:>8.2}x {:>8.2}x",
                spin.op.name(),
                spin.concurrency,
                s.rps,
                s.p99_ms,
                t.rps,
                t.p99_ms,
                t.rps / s.rps,
                s.p99_ms / t.p99_ms
            );
        }
    }

    /// The throughput and ratio tables of one side of the app.
    fn side_tables(&self, side: Side, out: &mut String) {
        let _ = writeln!(
            out,
            "\nThroughput and latency. host = the app through spin-host over HTTP; native = the same store operation over rusqlite in this process; hello = a hello-world component through the same host. cpu = CPU µs the serving process spent per request."
        );
        let _ = writeln!(
            out,
            "{:<16} {:>3} | {:>7} {:>7} {:>7} {:>7} {:>6} | {:>7} {:>6} {:>6} {:>5} | {:>7} {:>6} {:>6} {:>5}",
            "op",
            "c",
            "host/s",
            "p50 ms",
            "p99 ms",
            "mean",
            "cpu",
            "nativ/s",
            "p50",
            "p99",
            "cpu",
            "hello/s",
            "p50",
            "p99",
            "cpu"
        );
        let nan = f64::NAN;
        let cpu = |s: &Stats| s.cpu_us_per_request.unwrap_or(nan);
        for row in self.side_rows(side) {
            let h = row.host;
            let (n_rps, n_p50, n_p99, n_cpu) = row.native.map_or((nan, nan, nan, nan), |n| {
                (n.rps, n.p50_ms, n.p99_ms, cpu(n))
            });
            let (w_rps, w_p50, w_p99, w_cpu) = row.hello.map_or((nan, nan, nan, nan), |w| {
                (w.rps, w.p50_ms, w.p99_ms, cpu(w))
            });
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>7.0} {:>7.3} {:>7.3} {:>7.3} {:>6.0} | {:>7.0} {:>6.3} {:>6.3} {:>5.0} | {:>7.0} {:>6.3} {:>6.3} {:>5.0}{}",
                row.op.name(),
                row.concurrency,
                h.rps,
                h.p50_ms,
                h.p99_ms,
                h.mean_ms,
                cpu(h),
                n_rps,
                n_p50,
                n_p99,
                n_cpu,
                w_rps,
                w_p50,
                w_p99,
                w_cpu,
                if h.errors > 0 {
                    format!(
                        "  ({} errors: {})",
                        h.errors,
                        h.first_error.as_deref().unwrap_or("")
                    )
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(
            out,
            "\nRatios against the baselines of this run. gap = host − hello − native: what the Wasm boundary and our code (auth, parsing, rendering, host calls) add to the two floors."
        );
        let _ = writeln!(
            out,
            "{:<16} {:>3} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>8} {:>8}",
            "op",
            "c",
            "p50/nat",
            "rps n/h",
            "cpu h/n",
            "p50/hel",
            "rps w/h",
            "cpu h/w",
            "gap ms",
            "gap cpu"
        );
        for row in self.side_rows(side) {
            let h = row.host;
            let n = row.native;
            let w = row.hello;
            let ratio =
                |f: &dyn Fn(&Stats) -> f64, a: Option<&Stats>, b: Option<&Stats>| match (a, b) {
                    (Some(a), Some(b)) => f(a) / f(b),
                    _ => nan,
                };
            let p50 = |s: &Stats| s.p50_ms;
            let rps = |s: &Stats| s.rps;
            let gap_ms = h.p50_ms - w.map_or(nan, p50) - n.map_or(nan, p50);
            let gap_cpu = cpu(h) - w.map_or(nan, cpu) - n.map_or(nan, cpu);
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>8.1}x {:>8.1}x {:>8.1}x | {:>8.1}x {:>8.1}x {:>8.1}x | {:>8.3} {:>6.0}µs",
                row.op.name(),
                row.concurrency,
                ratio(&p50, Some(h), n),
                ratio(&rps, n, Some(h)),
                ratio(&cpu, Some(h), n),
                ratio(&p50, Some(h), w),
                ratio(&rps, w, Some(h)),
                ratio(&cpu, Some(h), w),
                gap_ms,
                gap_cpu,
            );
        }
        let compared: Vec<Row<'_>> = self
            .side_rows(side)
            .into_iter()
            .filter(|r| r.before.is_some())
            .collect();
        if !compared.is_empty() {
            let _ = writeln!(
                out,
                "\nBefore/after: the earlier build through its own host, in this run, on the same data."
            );
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>8} {:>7} {:>7} {:>7} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7}",
                "op",
                "c",
                "before/s",
                "p50 ms",
                "p99 ms",
                "mean",
                "cpu",
                "after/s",
                "p50 ms",
                "p99 ms",
                "mean",
                "cpu",
                "rps a/b",
                "p50 b/a",
                "p99 b/a",
                "mean b/a",
                "cpu b/a"
            );
            for row in compared {
                let b = row.before.expect("filtered");
                let a = row.host;
                let _ = writeln!(
                    out,
                    "{:<16} {:>3} | {:>8.0} {:>7.3} {:>7.3} {:>7.3} {:>6.0} | {:>7.0} {:>7.3} {:>7.3} {:>7.3} {:>6.0} | {:>6.2}x {:>6.2}x {:>6.2}x {:>6.2}x {:>6.2}x",
                    row.op.name(),
                    row.concurrency,
                    b.rps,
                    b.p50_ms,
                    b.p99_ms,
                    b.mean_ms,
                    cpu(b),
                    a.rps,
                    a.p50_ms,
                    a.p99_ms,
                    a.mean_ms,
                    cpu(a),
                    a.rps / b.rps,
                    b.p50_ms / a.p50_ms,
                    b.p99_ms / a.p99_ms,
                    b.mean_ms / a.mean_ms,
                    cpu(b) / cpu(a),
                );
            }
        }
    }

    /// The most writes per second one database can take when each holds the write lock for
    /// a round trip per statement: 1 / (round trips under the lock × RTT). The server takes
    /// the lock when it runs `BEGIN IMMEDIATE` and lets it go when it runs `COMMIT`, so the
    /// lock is held for one round trip per statement after the `BEGIN` (its answer's way
    /// back and the next request's way there make one): the statements inside the write
    /// transaction, `BEGIN` included, less one.
    fn write_bound(&self, point: &RttPoint) -> Option<f64> {
        let under_lock = self
            .statement_counts
            .iter()
            .find(|c| c.mode == "spin" && c.op == point.op)?
            .in_write_transaction;
        let round_trips = under_lock.checked_sub(1).filter(|n| *n > 0)?;
        (point.rtt_ms > 0).then(|| 1000.0 / (round_trips as f64 * point.rtt_ms as f64))
    }

    /// Write throughput against the bound, per simulated round trip.
    fn rtt_table(&self, out: &mut String) {
        if self.rtt_points.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nThe RTT curve: releases and reclaims on the shared deployment behind a network of that round trip to sqld (modelled at the TCP level: each new connection pays its handshake), each writer on its own unit, spread over 32 nodes or all on one reservation (hot); this build and the --before one, back to back; hot/spread = this row's req/s over the same build's spread row; bound = 1 / (round trips under the write lock x RTT) when a write holds the lock across round trips (none does: -)."
        );
        let _ = writeln!(
            out,
            "{:<10} {:<6} {:>5} {:>6} {:>3} | {:>7} {:>8} {:>8} {:>8} {:>6} | {:>11} | {:>8} {:>7}",
            "op",
            "build",
            "nodes",
            "rtt ms",
            "c",
            "req/s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "errors",
            "hot/spread",
            "bound/s",
            "of bound"
        );
        for point in &self.rtt_points {
            let s = &point.stats;
            let bound = self.write_bound(point);
            let spread = self.rtt_points.iter().find(|p| {
                p.build == point.build
                    && p.rtt_ms == point.rtt_ms
                    && p.op == point.op
                    && p.stats.concurrency == s.concurrency
                    && p.nodes > 1
            });
            let _ = writeln!(
                out,
                "{:<10} {:<6} {:>5} {:>6} {:>3} | {:>7.0} {:>8.2} {:>8.2} {:>8.2} {:>6} | {:>11} | {:>8} {:>7}",
                point.op.name(),
                point.build,
                point.nodes,
                point.rtt_ms,
                s.concurrency,
                s.rps,
                s.p50_ms,
                s.p99_ms,
                s.max_ms,
                s.errors,
                spread
                    .filter(|_| point.nodes == 1)
                    .map_or("-".to_owned(), |p| format!(
                        "{:.2}",
                        s.rps / p.stats.rps.max(f64::MIN_POSITIVE)
                    )),
                bound.map_or("-".to_owned(), |b| format!("{b:.0}")),
                bound.map_or("-".to_owned(), |b| format!("{:.0}%", 100.0 * s.rps / b)),
            );
        }
    }

    fn edge(
        &self,
        build: &str,
        layout: EdgeLayout,
        rtt_ms: u64,
        op: Op,
        c: usize,
    ) -> Option<&Stats> {
        self.edge_points
            .iter()
            .find(|p| {
                p.build == build
                    && p.layout == layout
                    && p.rtt_ms == rtt_ms
                    && p.op == op
                    && p.concurrency == c
            })
            .map(|p| &p.stats)
    }

    fn edge_lag(&self, build: &str, rtt_ms: u64) -> Option<&EdgeLag> {
        self.edge_lags
            .iter()
            .find(|l| l.build == build && l.rtt_ms == rtt_ms)
    }

    /// The edge comparison: every workload at the far primary and at sites, then the goals.
    fn edge_table(&self, out: &mut String) {
        if self.edge_points.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nEdge sites: 2 sites x 2 app replicas. far primary = the 4 replicas all on the primary, across a network of that round trip (TCP level: every new connection pays its handshake); sites = each site's replicas on its own sqld read replica, the replica across that network from the primary, writes sent to the home app beside the primary across the same distance; far app = the 4 replicas on the far primary with no replica, writes sent to the home. Writes spread over 32 nodes; cpu = the primary sqld's CPU per request; home conns/req = connections opened to the home per request (a build before writes at home opens none)."
        );
        let _ = writeln!(
            out,
            "{:<8} {:<6} {:<12} {:>6} {:>3} | {:>7} {:>8} {:>8} {:>6} | {:>12} {:>10}",
            "op",
            "build",
            "layout",
            "rtt ms",
            "c",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "primary us/req",
            "home c/req"
        );
        for p in &self.edge_points {
            let s = &p.stats;
            let _ = writeln!(
                out,
                "{:<8} {:<6} {:<12} {:>6} {:>3} | {:>7.0} {:>8.2} {:>8.2} {:>6} | {:>12} {:>10}",
                p.op.name(),
                p.build,
                p.layout.name(),
                p.rtt_ms,
                p.concurrency,
                s.rps,
                s.p50_ms,
                s.p99_ms,
                s.errors,
                s.cpu_us_per_request
                    .map_or("-".to_owned(), |c| format!("{c:.0}")),
                p.home_connections.map_or("-".to_owned(), |n| format!(
                    "{:.3}",
                    n as f64 / s.requests.max(1) as f64
                )),
            );
        }
        for cold in &self.edge_cold_writes {
            let _ = writeln!(
                out,
                "at {} ms, {} build, {}: the first release after the connections to the home went idle (91 s) took {:.1} ms (goal <= {:.0}), opening {} connection(s) to the home",
                cold.rtt_ms,
                cold.build,
                cold.layout.name(),
                cold.elapsed.as_secs_f64() * 1000.0,
                2.5 * cold.rtt_ms as f64 + 10.0,
                cold.home_connections,
            );
        }
        let mut rtts: Vec<u64> = self.edge_points.iter().map(|p| p.rtt_ms).collect();
        rtts.dedup();
        for rtt in rtts {
            let (sites, far, far_app) = (
                EdgeLayout::Sites,
                EdgeLayout::FarPrimary,
                EdgeLayout::FarApp,
            );
            let this = |layout, op, c| self.edge("this", layout, rtt, op, c);
            let p50 = |layout, op, c| this(layout, op, c).map_or(f64::NAN, |s| s.p50_ms);
            let rps = |layout| this(layout, Op::Release, 32).map_or(f64::NAN, |s| s.rps);
            let cpu = |layout| {
                this(layout, Op::Release, 32)
                    .and_then(|s| s.cpu_us_per_request)
                    .unwrap_or(f64::NAN)
            };
            let bound = 1.5 * rtt as f64 + 10.0;
            let _ = writeln!(
                out,
                "at {rtt} ms: c=1 release p50 {:.1} ms, reclaim {:.1} ms at sites (goal <= {bound:.0}; far primary {:.1}, {:.1}); far app, writes at home: release {:.1} ms, reclaim {:.1} ms (goal <= {:.0}); GET p50 {:.2} ms at sites (goal <= 5; far primary {:.1}); c=32 writes/s sites/far {:.2}; primary CPU per write sites/far {:.2}",
                p50(sites, Op::Release, 1),
                p50(sites, Op::Reclaim, 1),
                p50(far, Op::Release, 1),
                p50(far, Op::Reclaim, 1),
                p50(far_app, Op::Release, 1),
                p50(far_app, Op::Reclaim, 1),
                rtt as f64 + 10.0,
                p50(sites, Op::Get, 1),
                p50(far, Op::Get, 1),
                rps(sites) / rps(far),
                cpu(sites) / cpu(far),
            );
            let before_p50 = |op| {
                self.edge("before", sites, rtt, op, 1)
                    .map_or(f64::NAN, |s| s.p50_ms)
            };
            if self.edge("before", sites, rtt, Op::Release, 1).is_some() {
                let _ = writeln!(
                    out,
                    "at {rtt} ms at sites, c=1, before/after p50: release {:.1}/{:.1} ms, reclaim {:.1}/{:.1} ms, GET {:.2}/{:.2} ms",
                    before_p50(Op::Release),
                    p50(sites, Op::Release, 1),
                    before_p50(Op::Reclaim),
                    p50(sites, Op::Reclaim, 1),
                    before_p50(Op::Get),
                    p50(sites, Op::Get, 1),
                );
            }
            for build in ["this", "before"] {
                if let Some(lag) = self.edge_lag(build, rtt) {
                    let (p50, p99, max) = lag.percentiles();
                    let _ = writeln!(
                        out,
                        "at {rtt} ms, {build} build: replication lag to the far site under the c=32 writes: p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms ({} samples)",
                        lag.samples.len()
                    );
                }
            }
            let write_p99 = |build| {
                self.edge(build, sites, rtt, Op::Release, 32)
                    .map(|s| s.p99_ms)
            };
            let lag_p99 = |build| self.edge_lag(build, rtt).map(|l| l.percentiles().1);
            if let (Some(before), Some(after), Some(lag_before), Some(lag_after)) = (
                write_p99("before"),
                write_p99("this"),
                lag_p99("before"),
                lag_p99("this"),
            ) {
                let _ = writeln!(
                    out,
                    "at {rtt} ms at sites, c=32: release p99 before/after {:.2}x, replication lag p99 before/after {:.2}x",
                    before / after,
                    lag_before / lag_after,
                );
            }
        }
    }

    /// Local files (one host, SQLite as Spin runs it) against the shared deployment.
    fn shared_table(&self, out: &mut String) {
        let shared: Vec<(Row<'_>, &Stats)> = self
            .side_rows(Side::Host)
            .into_iter()
            .filter_map(|r| {
                let s = self.find(Side::Shared, r.op, r.concurrency)?;
                Some((r, s))
            })
            .collect();
        if !shared.is_empty() {
            let _ = writeln!(
                out,
                "\nLocal files (one host) against a shared deployment (replicas on one sqld and one Redis, clients spread over them), in this run, on the same data."
            );
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>7} {:>7} {:>7} | {:>8} {:>7} {:>7} | {:>8} {:>8}",
                "op",
                "c",
                "local/s",
                "p50 ms",
                "p99 ms",
                "shared/s",
                "p50 ms",
                "p99 ms",
                "rps s/l",
                "p99 s/l"
            );
            for (row, s) in shared {
                let l = row.host;
                let _ = writeln!(
                    out,
                    "{:<16} {:>3} | {:>7.0} {:>7.3} {:>7.3} | {:>8.0} {:>7.3} {:>7.3} | {:>7.2}x {:>7.2}x",
                    row.op.name(),
                    row.concurrency,
                    l.rps,
                    l.p50_ms,
                    l.p99_ms,
                    s.rps,
                    s.p50_ms,
                    s.p99_ms,
                    s.rps / l.rps,
                    s.p99_ms / l.p99_ms,
                );
            }
        }
    }

    /// Errors of the baselines, the scale curve, cold start and size.
    fn rest_of_table(&self, out: &mut String) {
        for m in &self.measurements {
            if m.stats.errors > 0 && !matches!(m.side, Side::Host | Side::Tuned) {
                let _ = writeln!(
                    out,
                    "  {:?} {} c={}: {} errors: {}",
                    m.side,
                    m.op.name(),
                    m.stats.concurrency,
                    m.stats.errors,
                    m.stats.first_error.as_deref().unwrap_or("")
                );
            }
        }

        let series = self.scale_series();
        if let Some(first) = series.first() {
            let _ = writeln!(
                out,
                "\nScale curve: release/reclaim of 1 unit and a dry run on a reservation of N units with N-1 VMs on the node, one request at a time, sizes taking turns. p50 latency, and CPU µs the server spent per request."
            );
            let _ = write!(out, "{:<10} {:<8} {:<7} |", "op", "repr", "side");
            for (units, _, _) in &first.points {
                let _ = write!(out, " {:>9}", format!("N={units}"));
            }
            let _ = write!(out, " {:>8} |", "max/min");
            for (units, _, _) in &first.points {
                let _ = write!(out, " {:>9}", format!("N={units}"));
            }
            let _ = writeln!(out, " {:>8}", "max/min");
            let _ = write!(out, "{:<28} |", "");
            for _ in &first.points {
                let _ = write!(out, " {:>9}", "p50 ms");
            }
            let _ = write!(out, " {:>8} |", "");
            for _ in &first.points {
                let _ = write!(out, " {:>9}", "cpu µs");
            }
            let _ = writeln!(out);
            for s in &series {
                let _ = write!(
                    out,
                    "{:<10} {:<8} {:<7}",
                    s.op.name(),
                    s.representation,
                    format!("{:?}", s.side).to_lowercase()
                );
                let _ = write!(out, " |");
                for (_, p50, _) in &s.points {
                    let _ = write!(out, " {p50:>9.3}");
                }
                let _ = write!(out, " {:>7.2}x |", s.largest_over_smallest(p50_of));
                for (_, _, cpu) in &s.points {
                    let _ = write!(out, " {cpu:>9.0}");
                }
                let _ = writeln!(out, " {:>7.2}x", s.largest_over_smallest(cpu_of));
            }
            for p in &self.scale_points {
                if p.stats.errors > 0 {
                    let _ = writeln!(
                        out,
                        "  {:?} {} {} N={}: {} errors: {}",
                        p.side,
                        p.op.name(),
                        p.representation,
                        p.units,
                        p.stats.errors,
                        p.stats.first_error.as_deref().unwrap_or("")
                    );
                }
            }
        }

        let _ = writeln!(out, "\nCold start and size.");
        for (name, bytes) in &self.sizes {
            let _ = writeln!(
                out,
                "  {:<14} {:>9} bytes ({:.2} MiB)",
                name,
                bytes,
                *bytes as f64 / (1024.0 * 1024.0)
            );
        }
        for (what, d) in &self.cold_start {
            let _ = writeln!(
                out,
                "  time to first response, {what}: {:.0} ms",
                d.as_secs_f64() * 1000.0
            );
        }
        let _ = writeln!(
            out,
            "  time to first response, shared disk cache (the benchmarked host): {:.0} ms",
            self.warm_start.as_secs_f64() * 1000.0
        );
    }
}
