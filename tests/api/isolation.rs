//! One tenant's burst beside another tenant's work: while one org runs 32 concurrent writers
//! on its own node (each on its own unit of one reservation), another org keeps writing and
//! reading on another node. Asserted: every write of both is answered, the burst's with 200
//! (at most 1 % 503 `write-contention`, nothing else), the other org's all with 200 (a read
//! at an edge site whose copy lags the org's own write asked again, as its 503 `site-behind` says). Measured
//! and printed, not asserted (speed belongs to benchmarks): the other org's write latency
//! against its idle values, divided by its reads' slowdown in the same run, which share the
//! machine's CPU with the burst and so say how much of any slowdown is load rather than
//! waiting for the burst (docs/benchmarks.md, "One tenant's burst beside another's writes").
//! The burst runs twice, without org write shares and with the edge's share per org
//! (docs/design.md, "One org's share of the writes"), so the two are compared in one run.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use api_support::latency::Percentiles;
use api_support::positions::cells_under_test;
use api_support::stores::RemoteStores;
use api_support::{App, Client, ReservationSpec, Scenario, SetOnDrop, TempDir};
use reservations_store::cells::Cells;
use reservations_store::share::{EDGE_WRITE_SHARE, WINDOW_SECS, share_key, window_now};

const BURST_WRITERS: usize = 32;
const SAMPLES: usize = 40;

fn ratio(loaded: Duration, idle: Duration) -> f64 {
    loaded.as_secs_f64() / idle.as_secs_f64().max(1e-6)
}

/// The quiet org's writes (a release and the reclaim that undoes it) and reads (its
/// reservation), interleaved, each timed.
fn sample(client: &Client, path: &str) -> (Vec<Duration>, Vec<Duration>) {
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        let action = if i % 2 == 0 { "release" } else { "reclaim" };
        let started = Instant::now();
        client
            .post(&format!("{path}/{action}"), &json!({"unitIds": ["q0"]}))
            .expect_status(200);
        writes.push(started.elapsed());
        let started = Instant::now();
        read_when_the_copy_has_it(client, path);
        reads.push(started.elapsed());
    }
    (writes, reads)
}

/// Reads `path`, asking again (after its `Retry-After`) while the answer is 503
/// `site-behind`: at an edge site under the burst, the copy the read is served from may take
/// longer than a bookmark is waited for to reach the caller's own last write, which the API
/// answers so, saying to retry (docs/design.md, "Reads at a site"). Anything else than 200
/// fails.
fn read_when_the_copy_has_it(client: &Client, path: &str) {
    for _ in 0..30 {
        let reply = client.get(path);
        if reply.status == 503 && reply.text().contains("\"site-behind\"") {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        reply.expect_status(200);
        return;
    }
    panic!("the site's copy never reached the quiet org's own write");
}

/// The other org's writes against idle during one org's burst, divided by its reads'
/// slowdown, at p50 and p99, on an app whose orgs each run at most `share` write statements at
/// once (0: no shares).
fn burst_beside_another_org(share: i64) -> (f64, f64) {
    let app =
        App::start_with(|config| config.env("SPIN_VARIABLE_ORG_WRITE_SHARE", share.to_string()));
    let hot_units: Vec<String> = (0..BURST_WRITERS).map(|i| format!("h{i}")).collect();
    let hot_unit_refs: Vec<&str> = hot_units.iter().map(String::as_str).collect();
    let scene = Scenario::new()
        .orgs(&["busy", "quiet"])
        .node("busy-node", "busy", &hot_unit_refs)
        // In another cell than the busy node's, whatever the number of cells (2 to 8).
        .node("quiet-node-0", "quiet", &["q0", "q1"])
        .reservation("busy", ReservationSpec::on("busy-node", &hot_unit_refs))
        .reservation("quiet", ReservationSpec::on("quiet-node-0", &["q0", "q1"]))
        .key("busy", "busy", "capacity-manager")
        .key("quiet", "quiet", "capacity-manager")
        .make_in(&app);
    let cells = Cells::new(cells_under_test()).expect("cells under test");
    if cells.count() > 1 {
        assert_ne!(
            cells.home_of("busy-node"),
            cells.home_of("quiet-node-0"),
            "the quiet org's node is in another cell than the burst's"
        );
    }
    let busy_path = scene.reservation_path("busy");
    let quiet_path = scene.reservation_path("quiet");
    let quiet = scene.client("quiet");
    let busy = scene.client("busy").with_header("prefer", "return=minimal");

    sample(&quiet, &quiet_path); // warm the components' caches
    let (idle_writes, idle_reads) = sample(&quiet, &quiet_path);

    let stop = AtomicBool::new(false);
    let (done, refused, failed) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let started_writers = AtomicUsize::new(0);
    let (loaded_writes, loaded_reads) = std::thread::scope(|scope| {
        // Stops the burst however this thread leaves the scope, a failed assertion included.
        let _stops = SetOnDrop::new(&stop, true);
        for unit in &hot_units {
            let (busy, busy_path, stop) = (&busy, &busy_path, &stop);
            let (done, refused, failed, started_writers) =
                (&done, &refused, &failed, &started_writers);
            scope.spawn(move || {
                let mut first = true;
                for action in ["release", "reclaim"].iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let reply = busy.post(
                        &format!("{busy_path}/{action}"),
                        &json!({"unitIds": [unit]}),
                    );
                    match reply.status {
                        200 => done.fetch_add(1, Ordering::Relaxed),
                        503 => refused.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                    if first {
                        started_writers.fetch_add(1, Ordering::Relaxed);
                        first = false;
                    }
                }
            });
        }
        // Measured once every writer of the burst has had an answer: the burst is on.
        let deadline = Instant::now() + Duration::from_secs(120);
        while started_writers.load(Ordering::Relaxed) < BURST_WRITERS {
            assert!(Instant::now() < deadline, "the burst never got going");
            std::thread::sleep(Duration::from_millis(10));
        }
        sample(&quiet, &quiet_path)
    });

    let (done, refused, failed) = (done.into_inner(), refused.into_inner(), failed.into_inner());
    assert_eq!(failed, 0, "the burst's writes answered only 200 or 503");
    assert!(
        done >= BURST_WRITERS,
        "the burst's writers each got through: {done}"
    );
    assert!(
        refused * 100 <= done + refused,
        "at most 1 % of the burst's writes refused for contention: {refused} of {}",
        done + refused
    );

    let (idle_writes, idle_reads) = (Percentiles::of(idle_writes), Percentiles::of(idle_reads));
    let (writes, reads) = (
        Percentiles::of(loaded_writes),
        Percentiles::of(loaded_reads),
    );
    // The reads' slowdown is the machine's: a write that waits for nobody slows as much.
    let load_p50 = ratio(reads.p50, idle_reads.p50).max(1.0);
    let load_p99 = ratio(reads.p99, idle_reads.p99).max(1.0);
    let writes_p50 = ratio(writes.p50, idle_writes.p50) / load_p50;
    let writes_p99 = ratio(writes.p99, idle_writes.p99) / load_p99;
    eprintln!(
        "isolation, share {share}: {done} burst writes ({refused} refused); quiet writes p50 {:?} -> {:?}, \
         p99 {:?} -> {:?}; reads p50 {:?} -> {:?}, p99 {:?} -> {:?}; writes over reads: p50 \
         {writes_p50:.2}x, p99 {writes_p99:.2}x",
        idle_writes.p50,
        writes.p50,
        idle_writes.p99,
        writes.p99,
        idle_reads.p50,
        reads.p50,
        idle_reads.p99,
        reads.p99
    );
    assert!(writes_p50.is_finite() && writes_p99.is_finite());
    (writes_p50, writes_p99)
}

#[test]
fn one_org_s_burst_on_its_node_is_answered_whole_beside_another_org_s_writes() {
    let without = burst_beside_another_org(0);
    let with = burst_beside_another_org(EDGE_WRITE_SHARE);
    eprintln!(
        "isolation: the other org's writes over its reads, p50 {:.2}x -> {:.2}x, p99 {:.2}x -> \
         {:.2}x, without -> with a share of {EDGE_WRITE_SHARE} per org",
        without.0, with.0, without.1, with.1
    );
}

/// A share that requests never gave back (their replica was killed mid-write, say) holds only
/// its org, and only until its window ends: another org writes at once meanwhile, and the
/// org's own write goes once the window has turned. On a sqld and a Redis of the test's own,
/// whatever `TEST_STORES` says, as the edge runs: each org's share counted in Redis.
#[test]
fn a_share_left_full_holds_only_its_org_and_only_until_its_window_ends() {
    let dir = TempDir::new("shares");
    let stores = RemoteStores::start(dir.path());
    let app = App::start_on(&stores);
    let scene = Scenario::new()
        .orgs(&["left", "other"])
        .node("left-node", "left", &["l0"])
        .node("other-node", "other", &["o0"])
        .reservation("left", ReservationSpec::on("left-node", &["l0"]))
        .reservation("other", ReservationSpec::on("other-node", &["o0"]))
        .key("left", "left", "capacity-manager")
        .key("other", "other", "capacity-manager")
        .make_in(&app);
    // Well inside a window, so that the share stays full for a while yet.
    while seconds_into_window() >= WINDOW_SECS - 3 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let window = window_now();
    stores
        .redis
        .set(&share_key("left", window), &EDGE_WRITE_SHARE.to_string());

    let answered = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let left = scene.client("left");
            left.post(
                &format!("{}/release", scene.reservation_path("left")),
                &json!({"unitIds": ["l0"]}),
            )
            .expect_status(200);
            answered.lock().unwrap().push(("left", window_now()));
        });
        let other = scene.client("other");
        other
            .post(
                &format!("{}/release", scene.reservation_path("other")),
                &json!({"unitIds": ["o0"]}),
            )
            .expect_status(200);
        answered.lock().unwrap().push(("other", window_now()));
    });
    let answered = answered.into_inner().unwrap();
    assert_eq!(answered[0], ("other", window), "{answered:?}");
    assert_eq!(answered[1].0, "left", "{answered:?}");
    assert!(
        answered[1].1 > window,
        "the left org wrote only once the window had turned: {answered:?}"
    );
}

fn seconds_into_window() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    now.as_secs() % WINDOW_SECS
}
