//! Latency figures the suites print (never assert: speed belongs to the benchmarks).

use std::time::Duration;

/// The p50, p99 and max of a run's latencies (nearest rank).
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    pub fn of(mut latencies: Vec<Duration>) -> Percentiles {
        assert!(!latencies.is_empty(), "no latencies to summarise");
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}
