//! The built-in load generator: `concurrency` threads, each with its own state (an HTTP agent
//! with a keep-alive connection, or a database connection), issuing one operation after
//! another for a warm-up and then a measured window. Only operations that start inside the
//! window are recorded.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How long to run a workload.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one operation did.
pub enum Step {
    Done,
    /// The operation failed; the message of the first failure is kept.
    Failed(String),
    /// Nothing left to do (e.g. every released unit has been reclaimed): this worker stops.
    Exhausted,
}

/// Throughput and latency of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub concurrency: usize,
    pub requests: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub rps: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// CPU time (user + system, all threads) the serving process spent per request in the
    /// measured window: what a request costs, much less sensitive to other load on the
    /// machine than wall-clock latency.
    pub cpu_us_per_request: Option<f64>,
}

impl Stats {
    pub fn from_latencies(
        concurrency: usize,
        mut latencies: Vec<Duration>,
        errors: usize,
        first_error: Option<String>,
        window: Duration,
    ) -> Stats {
        latencies.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let quantile = |q: f64| -> f64 {
            if latencies.is_empty() {
                return f64::NAN;
            }
            let rank = ((latencies.len() as f64) * q).ceil() as usize;
            ms(latencies[rank.clamp(1, latencies.len()) - 1])
        };
        let total: Duration = latencies.iter().sum();
        let seconds = window.as_secs_f64();
        Stats {
            concurrency,
            requests: latencies.len(),
            errors,
            first_error,
            seconds,
            rps: if seconds > 0.0 {
                latencies.len() as f64 / seconds
            } else {
                f64::NAN
            },
            mean_ms: if latencies.is_empty() {
                f64::NAN
            } else {
                ms(total) / latencies.len() as f64
            },
            p50_ms: quantile(0.50),
            p99_ms: quantile(0.99),
            max_ms: latencies.last().copied().map(ms).unwrap_or(f64::NAN),
            cpu_us_per_request: None,
        }
    }
}

struct WorkerResult {
    latencies: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
    measure_from: Instant,
    /// When this worker ran out of work, if it did before the end.
    exhausted_at: Option<Instant>,
}

/// Which process serves the requests, for [`Stats::cpu_us_per_request`].
#[derive(Debug, Clone, Copy)]
pub enum Server {
    /// A subprocess (the host).
    Process(u32),
    /// This process (the native store); the load generator's own CPU is negligible there.
    ThisProcess,
    /// The calling thread (the native store, one request at a time).
    ThisThread,
}

impl Server {
    /// CPU time used so far, from `/proc/<pid>/stat` (Linux), all threads.
    fn cpu_time(self) -> Option<Duration> {
        let path = match self {
            Server::Process(pid) => format!("/proc/{pid}/stat"),
            Server::ThisProcess | Server::ThisThread => "/proc/self/stat".to_owned(),
        };
        let stat = std::fs::read_to_string(path).ok()?;
        // The fields after the command name, which is in parentheses and may contain spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // USER_HZ is 100 on every Linux platform Rust supports.
        Some(Duration::from_millis(ticks * 10))
    }

    /// CPU time used so far to the nanosecond, for measuring one request: all threads of a
    /// process (`schedstat`, brought up to date whenever a thread sleeps, as the server's do
    /// once they have answered), or the calling thread. A thread that ends between two
    /// readings takes its time with it, so a difference can only be too small, and rarely is.
    pub fn cpu_time_precise(self) -> Option<Duration> {
        let on_cpu = |path: &std::path::Path| -> Option<u64> {
            std::fs::read_to_string(path)
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let nanos = match self {
            Server::ThisThread => return thread_cpu_time(),
            Server::Process(_) | Server::ThisProcess => {
                let tasks = match self {
                    Server::Process(pid) => format!("/proc/{pid}/task"),
                    _ => "/proc/self/task".to_owned(),
                };
                std::fs::read_dir(tasks)
                    .ok()?
                    .flatten()
                    .filter_map(|task| on_cpu(&task.path().join("schedstat")))
                    .sum()
            }
        };
        Some(Duration::from_nanos(nanos))
    }
}

/// Runs `operation` on `concurrency` threads; `new_worker(i)` builds thread `i`'s state.
pub fn run<W>(
    server: Server,
    concurrency: usize,
    timing: Timing,
    new_worker: impl Fn(usize) -> W + Sync,
    operation: impl Fn(&mut W) -> Step + Sync,
) -> Stats {
    let barrier = Barrier::new(concurrency + 1);
    let mut cpu = (None, None);
    let results: Vec<WorkerResult> = std::thread::scope(|scope| {
        let (barrier, new_worker, operation) = (&barrier, &new_worker, &operation);
        let handles: Vec<_> = (0..concurrency)
            .map(|i| {
                scope.spawn(move || {
                    let mut state = new_worker(i);
                    barrier.wait();
                    let start = Instant::now();
                    worker_loop(&mut state, start, timing, operation)
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(timing.warmup);
        cpu.0 = server.cpu_time();
        // Every worker may finish early (out of units): stop sampling when they all have.
        let end = Instant::now() + timing.measure;
        while Instant::now() < end && handles.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        cpu.1 = server.cpu_time();
        handles
            .into_iter()
            .map(|h| h.join().expect("a load worker panicked"))
            .collect()
    });
    let measure_from = results.iter().map(|r| r.measure_from).min();
    // Every worker ran out of work before the end: the window ends with the last of them.
    let all_exhausted_at = results
        .iter()
        .map(|r| r.exhausted_at)
        .collect::<Option<Vec<Instant>>>()
        .and_then(|ends| ends.into_iter().max());
    let window = match (measure_from, all_exhausted_at) {
        (Some(from), Some(end)) => end.saturating_duration_since(from).min(timing.measure),
        _ => timing.measure,
    };
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for r in results {
        latencies.extend(r.latencies);
        errors += r.errors;
        first_error = first_error.or(r.first_error);
    }
    let mut stats = Stats::from_latencies(concurrency, latencies, errors, first_error, window);
    if let (Some(before), Some(after)) = cpu
        && stats.requests > 0
    {
        stats.cpu_us_per_request =
            Some((after - before).as_secs_f64() * 1e6 / stats.requests as f64);
    }
    stats
}

fn worker_loop<W>(
    state: &mut W,
    start: Instant,
    timing: Timing,
    operation: &(impl Fn(&mut W) -> Step + Sync),
) -> WorkerResult {
    let measure_from = start + timing.warmup;
    let end = measure_from + timing.measure;
    let mut result = WorkerResult {
        latencies: Vec::with_capacity(4096),
        errors: 0,
        first_error: None,
        measure_from,
        exhausted_at: None,
    };
    loop {
        let began = Instant::now();
        if began >= end {
            break;
        }
        let step = operation(state);
        let finished = Instant::now();
        let measured = began >= measure_from;
        match step {
            Step::Done if measured => result.latencies.push(finished - began),
            Step::Done => {}
            Step::Failed(message) => {
                if measured {
                    result.errors += 1;
                }
                result.first_error.get_or_insert(message);
            }
            Step::Exhausted => {
                result.exhausted_at = Some(finished);
                break;
            }
        }
    }
    result
}

/// Runs `operation` `iterations` times on this thread, after `warmup` unrecorded ones.
pub fn sequential(warmup: usize, iterations: usize, mut operation: impl FnMut() -> Step) -> Stats {
    for _ in 0..warmup {
        let _ = operation();
    }
    let mut latencies = Vec::with_capacity(iterations.min(1 << 20));
    let mut errors = 0;
    let mut first_error = None;
    let started = Instant::now();
    for _ in 0..iterations {
        let began = Instant::now();
        match operation() {
            Step::Done => latencies.push(began.elapsed()),
            Step::Failed(message) => {
                errors += 1;
                first_error.get_or_insert(message);
            }
            Step::Exhausted => break,
        }
    }
    let window = started.elapsed();
    Stats::from_latencies(1, latencies, errors, first_error, window)
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, exact even while it runs).
fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (status == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}
