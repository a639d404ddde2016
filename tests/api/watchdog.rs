//! The suites' sqld watchdog: a sqld that answers nothing (stopped with SIGSTOP, as a stalled
//! write queue looks from outside) fails the run within 20 s with its threads' stacks, and a
//! sqld that answers, even only "busy" under a flood of writers, is never called stalled.
//!
//! The watchdog aborts its process, so the stall is staged in a child: this test binary run
//! again on the one test below, which stops its sqld and waits.

use std::process::Command;
use std::time::{Duration, Instant};

use api_support::TempDir;
use api_support::stores::{Probe, Sqld, classify};

const CHILD: &str = "WATCHDOG_STAGE_A_STALL";

#[test]
fn a_stopped_sqld_fails_the_run_within_20_s_with_its_stacks() {
    if std::env::var_os(CHILD).is_some() {
        let dir = TempDir::new("watchdog");
        let sqld = Sqld::start(dir.path());
        sqld.freeze();
        std::thread::sleep(Duration::from_secs(90));
        panic!("the watchdog let a stopped sqld be for 90 s");
    }
    let started = Instant::now();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "watchdog::a_stopped_sqld_fails_the_run_within_20_s_with_its_stacks",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the staged stall");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(!child.status.success(), "the run passed: {stderr}");
    assert!(
        !stderr.contains("let a stopped sqld be"),
        "the watchdog never fired: {stderr}"
    );
    assert!(stderr.contains("sqld STALLED"), "{stderr}");
    assert!(
        stderr.contains("Thread ") || stderr.contains("TID "),
        "no thread stacks: {stderr}"
    );
    eprintln!("the stall failed the run after {took:?}");
    assert!(took < Duration::from_secs(20 + 10), "it took {took:?}");
}

#[test]
fn a_busy_answer_is_an_answer_not_a_stall() {
    let busy = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n\
                {\"results\":[{\"error\":{\"message\":\"SQLite error: database is locked\"}}]}";
    assert!(matches!(classify(busy), Some(Probe::Answered(m)) if m.contains("locked")));
    let flooded = "HTTP/1.1 503 Service Unavailable\r\n\r\nToo many concurrent requests";
    assert!(matches!(classify(flooded), Some(Probe::Answered(_))));
    let written = "HTTP/1.1 200 OK\r\n\r\n[{\"results\":{\"columns\":[],\"rows\":[]}}]";
    assert_eq!(classify(written), Some(Probe::Written));
    assert_eq!(classify(""), None);
}
