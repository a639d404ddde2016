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
    /// The app through the host over HTTP.
    Host,
    /// The store over rusqlite in process.
    Native,
    /// The hello-world component through the host.
    Hello,
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

fn representation_name(representation: Representation) -> &'static str {
    match representation {
        Representation::Minimal => "minimal",
        Representation::Full => "full",
    }
}

pub struct Results {
    pub measurements: Vec<Measurement>,
    pub scale_points: Vec<ScalePoint>,
    pub sizes: Vec<(String, u64)>,
    pub cold_start: Vec<(String, Duration)>,
    pub warm_start: Duration,
}

/// One line of the scale curve.
struct Series {
    side: Side,
    op: Op,
    representation: &'static str,
    p50_by_units: Vec<(usize, f64)>,
}

impl Series {
    /// p50 at the largest reservation over p50 at the smallest.
    fn largest_over_smallest(&self) -> f64 {
        match (self.p50_by_units.first(), self.p50_by_units.last()) {
            (Some(first), Some(last)) => last.1 / first.1,
            _ => f64::NAN,
        }
    }
}

const OPS: [Op; 4] = [Op::Release, Op::Reclaim, Op::DryRun, Op::Get];

/// One row of the throughput table: the app and both baselines at one concurrency.
struct Row<'a> {
    op: Op,
    concurrency: usize,
    host: &'a Stats,
    native: Option<&'a Stats>,
    hello: Option<&'a Stats>,
}

impl Row<'_> {
    fn json(&self) -> Value {
        let ratio = |a: f64, b: f64| round(a / b, 2);
        let mut row = json!({
            "op": self.op,
            "concurrency": self.concurrency,
            "host": { "rps": round(self.host.rps, 1), "p50Ms": round(self.host.p50_ms, 3), "p99Ms": round(self.host.p99_ms, 3), "requests": self.host.requests, "errors": self.host.errors },
        });
        if let Some(native) = self.native {
            row["native"] = json!({ "rps": round(native.rps, 1), "p50Ms": round(native.p50_ms, 3), "p99Ms": round(native.p99_ms, 3) });
            row["p50OverNative"] = json!(ratio(self.host.p50_ms, native.p50_ms));
            row["nativeRpsOverHost"] = json!(ratio(native.rps, self.host.rps));
        }
        if let Some(hello) = self.hello {
            row["hello"] = json!({ "rps": round(hello.rps, 1), "p50Ms": round(hello.p50_ms, 3), "p99Ms": round(hello.p99_ms, 3) });
            row["p50OverHello"] = json!(ratio(self.host.p50_ms, hello.p50_ms));
            row["helloRpsOverHost"] = json!(ratio(hello.rps, self.host.rps));
        }
        if let (Some(native), Some(hello)) = (self.native, self.hello) {
            // What is neither the HTTP/instantiation floor nor the storage floor: the Wasm
            // boundary (host calls, copies) and our code (auth, parsing, rendering).
            row["gapMs"] = json!(round(self.host.p50_ms - hello.p50_ms - native.p50_ms, 3));
        }
        row
    }
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
        for &c in &levels {
            for op in OPS {
                if let Some(host) = self.find(Side::Host, op, c) {
                    rows.push(Row {
                        op,
                        concurrency: c,
                        host,
                        native: self.find(Side::Native, op, c),
                        hello: self.find(Side::Hello, Op::Hello, c),
                    });
                }
            }
        }
        rows
    }

    /// The scale points grouped by (side, op, representation), smallest size first.
    fn scale_series(&self) -> Vec<Series> {
        let mut series: Vec<Series> = Vec::new();
        for point in &self.scale_points {
            let p50 = (point.units, point.stats.p50_ms);
            match series.iter_mut().find(|s| {
                (s.side, s.op, s.representation) == (point.side, point.op, point.representation)
            }) {
                Some(s) => s.p50_by_units.push(p50),
                None => series.push(Series {
                    side: point.side,
                    op: point.op,
                    representation: point.representation,
                    p50_by_units: vec![p50],
                }),
            }
        }
        for s in &mut series {
            s.p50_by_units.sort_by_key(|(units, _)| *units);
        }
        series
    }

    pub fn json(&self) -> Value {
        json!({
            "throughput": self.rows().iter().map(Row::json).collect::<Vec<_>>(),
            "measurements": self.measurements,
            "scale": self.scale_series().iter().map(|s| json!({
                "side": s.side, "op": s.op, "representation": s.representation,
                "p50Ms": s.p50_by_units.iter().map(|(units, p50)| json!({"units": units, "p50Ms": round(*p50, 3)})).collect::<Vec<_>>(),
                "largestOverSmallest": round(s.largest_over_smallest(), 2),
            })).collect::<Vec<_>>(),
            "scalePoints": self.scale_points,
            "wasmBytes": self.sizes.iter().map(|(name, bytes)| json!({"component": name, "bytes": bytes})).collect::<Vec<_>>(),
            "coldStart": self.cold_start.iter().map(|(what, d)| json!({"start": what, "timeToFirstResponseMs": round(d.as_secs_f64() * 1000.0, 1)})).collect::<Vec<_>>(),
            "benchHostTimeToFirstResponseMs": round(self.warm_start.as_secs_f64() * 1000.0, 1),
        })
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nThroughput and latency. host = the app through spin-host over HTTP; native = the same store operation over rusqlite in process; hello = hello-world component through the same host."
        );
        let _ = writeln!(
            out,
            "{:<16} {:>3} | {:>8} {:>8} {:>8} | {:>8} {:>7} {:>7} | {:>8} {:>7} | {:>8} {:>8} {:>8} {:>8} {:>8}",
            "op",
            "c",
            "host/s",
            "p50 ms",
            "p99 ms",
            "native/s",
            "p50",
            "p99",
            "hello/s",
            "p50",
            "p50/nat",
            "p50/hel",
            "nat/host",
            "hel/host",
            "gap ms"
        );
        for row in self.rows() {
            let (n_rps, n_p50, n_p99) = row.native.map_or((f64::NAN, f64::NAN, f64::NAN), |n| {
                (n.rps, n.p50_ms, n.p99_ms)
            });
            let (h_rps, h_p50) = row
                .hello
                .map_or((f64::NAN, f64::NAN), |h| (h.rps, h.p50_ms));
            let _ = writeln!(
                out,
                "{:<16} {:>3} | {:>8.0} {:>8.3} {:>8.3} | {:>8.0} {:>7.3} {:>7.3} | {:>8.0} {:>7.3} | {:>7.1}x {:>7.1}x {:>7.1}x {:>7.1}x {:>8.3}{}",
                row.op.name(),
                row.concurrency,
                row.host.rps,
                row.host.p50_ms,
                row.host.p99_ms,
                n_rps,
                n_p50,
                n_p99,
                h_rps,
                h_p50,
                row.host.p50_ms / n_p50,
                row.host.p50_ms / h_p50,
                n_rps / row.host.rps,
                h_rps / row.host.rps,
                row.host.p50_ms - h_p50 - n_p50,
                if row.host.errors > 0 {
                    format!(
                        "  ({} errors: {})",
                        row.host.errors,
                        row.host.first_error.as_deref().unwrap_or("")
                    )
                } else {
                    String::new()
                }
            );
        }
        for m in &self.measurements {
            if m.stats.errors > 0 && m.side != Side::Host {
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
                "\nScale curve: p50 ms at concurrency 1, release/reclaim 1 unit and dry run on a reservation of N units with N-1 VMs on the node."
            );
            let _ = write!(out, "{:<10} {:<8} {:<7}", "op", "repr", "side");
            for (units, _) in &first.p50_by_units {
                let _ = write!(out, " {:>10}", format!("N={units}"));
            }
            let _ = writeln!(out, " {:>10}", "max/min N");
            for s in &series {
                let _ = write!(
                    out,
                    "{:<10} {:<8} {:<7}",
                    s.op.name(),
                    s.representation,
                    format!("{:?}", s.side).to_lowercase()
                );
                for (_, p50) in &s.p50_by_units {
                    let _ = write!(out, " {p50:>10.3}");
                }
                let _ = writeln!(out, " {:>9.2}x", s.largest_over_smallest());
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
        out
    }
}
