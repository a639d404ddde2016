//! The Spin interfaces, driven through the probe component over real HTTP.

use api_support::http::*;
use api_support::probe::*;
use api_support::temp::TempDir;
use serde_json::json;
use spin_host::{Host, SqliteMode, StatementCounts, TimeDelta};

#[test]
fn hello() {
    let state = TempDir::new("hello");
    let host = start_probe(&state);
    let r = get(&format!("{}/hello", host.base_url()));
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hello");
}

#[test]
fn key_value_set_get_delete_exists_keys() {
    let state = TempDir::new("kv");
    let host = start_probe(&state);
    let base = host.base_url();

    assert_eq!(get(&format!("{base}/kv/get?key=a")).status, 404);
    assert_eq!(get(&format!("{base}/kv/exists?key=a")).text(), "false");
    assert_eq!(
        post(format!("{base}/kv/set?key=a").as_str(), b"one").status,
        200
    );
    assert_eq!(
        post(format!("{base}/kv/set?key=b").as_str(), [0u8, 159, 255]).status,
        200
    );

    let r = get(&format!("{base}/kv/get?key=a"));
    assert_eq!((r.status, r.text().as_str()), (200, "one"));
    assert_eq!(
        get(&format!("{base}/kv/get?key=b")).body,
        vec![0u8, 159, 255]
    );
    assert_eq!(get(&format!("{base}/kv/exists?key=a")).text(), "true");
    assert_eq!(get(&format!("{base}/kv/keys")).json(), json!(["a", "b"]));

    // Overwrite.
    post(format!("{base}/kv/set?key=a").as_str(), b"two");
    assert_eq!(get(&format!("{base}/kv/get?key=a")).text(), "two");

    assert_eq!(
        post(format!("{base}/kv/delete?key=a").as_str(), b"").status,
        200
    );
    assert_eq!(get(&format!("{base}/kv/get?key=a")).status, 404);
    assert_eq!(get(&format!("{base}/kv/exists?key=a")).text(), "false");
    assert_eq!(get(&format!("{base}/kv/keys")).json(), json!(["b"]));
    // Deleting a missing key is not an error.
    assert_eq!(
        post(format!("{base}/kv/delete?key=nope").as_str(), b"").status,
        200
    );
}

#[test]
fn key_value_persists_in_spins_file_and_table() {
    let state = TempDir::new("kv-file");
    {
        let host = start_probe(&state);
        post(format!("{}/kv/set?key=k", host.base_url()).as_str(), b"v");
    }
    let conn = rusqlite::Connection::open(state.path().join("sqlite_key_value.db")).unwrap();
    let value: Vec<u8> = conn
        .query_row(
            "SELECT value FROM spin_key_value WHERE store = 'default' AND key = 'k'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(value, b"v");
    drop(conn);
    // A new host on the same state dir sees it.
    let host = start_probe(&state);
    assert_eq!(
        get(&format!("{}/kv/get?key=k", host.base_url())).text(),
        "v"
    );
}

#[test]
fn key_value_access_denied_and_no_such_store() {
    let state = TempDir::new("kv-denied");
    let host = start_probe(&state);
    let base = host.base_url();
    // A store the component did not declare: denied, whether or not it exists.
    for url in [
        format!("{base}/kv/open?store=other"),
        format!("{base}/denied/kv/open?store=default"),
        format!("{base}/denied/kv/get?key=a"),
    ] {
        let r = get(&url);
        assert_eq!(
            (r.status, r.json()),
            (500, json!({ "error": "access-denied" })),
            "{url}"
        );
    }
    assert_eq!(
        get(&format!("{base}/kv/open?store=default")).text(),
        "opened"
    );
}

#[test]
fn sqlite_create_insert_select_all_types() {
    let state = TempDir::new("sqlite");
    let host = start_probe(&state);
    let exec = format!("{}/sqlite/exec", host.base_url());

    let r = post_json(
        &exec,
        &json!({ "sql": "CREATE TABLE things (id INTEGER PRIMARY KEY, n INTEGER, r REAL, t TEXT, b BLOB, z)" }),
    );
    assert_eq!(
        (r.status, r.json()),
        (200, json!({ "columns": [], "rows": [] }))
    );

    let insert = "INSERT INTO things (n, r, t, b, z) VALUES (?, ?, ?, ?, ?)";
    let r = post_json(
        &exec,
        &json!({ "sql": insert, "params": [
            { "integer": i64::MIN }, { "real": -0.125 }, { "text": "héllo 🌍" }, { "blob": "00ff10" }, null
        ] }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    post_json(
        &exec,
        &json!({ "sql": insert, "params": [{ "integer": 42 }, null, null, { "blob": "" }, { "text": "x" }] }),
    );

    let r = post_json(
        &exec,
        &json!({ "sql": "SELECT n, r, t, b, z FROM things ORDER BY id" }),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({
            "columns": ["n", "r", "t", "b", "z"],
            "rows": [
                [{ "integer": i64::MIN }, { "real": -0.125 }, { "text": "héllo 🌍" }, { "blob": "00ff10" }, null],
                [{ "integer": 42 }, null, null, { "blob": "" }, { "text": "x" }],
            ]
        })
    );

    // Positional parameters in a WHERE clause; expressions get their SQL text as column name.
    let r = post_json(
        &exec,
        &json!({ "sql": "SELECT count(*), max(n) FROM things WHERE n > ?", "params": [{ "integer": 0 }] }),
    );
    assert_eq!(
        r.json(),
        json!({ "columns": ["count(*)", "max(n)"], "rows": [[{ "integer": 1 }, { "integer": 42 }]] })
    );

    // The file is Spin's `default` database.
    let conn = rusqlite::Connection::open(state.path().join("sqlite_db.db")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM things", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

#[test]
fn sqlite_errors_are_io_with_sqlite_message() {
    let state = TempDir::new("sqlite-errors");
    let host = start_probe(&state);
    let exec = format!("{}/sqlite/exec", host.base_url());
    let r = post_json(&exec, &json!({ "sql": "SELECT * FROM missing" }));
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({ "error": "io", "message": "no such table: missing" })
    );
    let r = post_json(&exec, &json!({ "sql": "SELEC 1" }));
    assert_eq!(r.json()["error"], "io");
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("syntax error")
    );
}

/// Spin's two limits on the SQLite interface: 256 open connections per instance, and a
/// statement's result of at most 128 MiB.
#[test]
fn sqlite_connections_and_result_size_are_limited_as_in_spin() {
    let state = TempDir::new("sqlite-limits");
    let host = start_probe(&state);
    let base = host.base_url();
    let opened = get(&format!("{base}/sqlite/open-many?count=256")).json();
    assert_eq!(opened, json!({ "opened": 256, "error": null }));
    let opened = get(&format!("{base}/sqlite/open-many?count=300")).json();
    assert_eq!(opened["opened"], 256);
    assert!(
        opened["error"]
            .as_str()
            .unwrap()
            .contains("too many connections opened"),
        "{opened}"
    );
    // Each request is an instance of its own: the limit is per instance.
    let opened = get(&format!("{base}/sqlite/open-many?count=2")).json();
    assert_eq!(opened["opened"], 2);

    let exec = format!("{base}/sqlite/exec");
    // `n` rows of a 1 MiB blob each.
    let mib_rows = |n: u32| {
        json!({ "sql": format!(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {n}) \
             SELECT zeroblob(1048576) FROM c"
        ) })
    };
    let r = post_json(&exec, &mib_rows(129));
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({ "error": "io", "message": "query result exceeds limit of 134217728 bytes" })
    );
    let r = post_json(&exec, &mib_rows(1));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn sqlite_database_is_locked_reaches_the_guest() {
    let state = TempDir::new("sqlite-locked");
    let host = start_probe(&state);
    let exec = format!("{}/sqlite/exec", host.base_url());
    post_json(&exec, &json!({ "sql": "CREATE TABLE t (x)" }));
    // Another process-level writer holds the write lock...
    let other = rusqlite::Connection::open(state.path().join("sqlite_db.db")).unwrap();
    other
        .execute_batch("BEGIN EXCLUSIVE; INSERT INTO t VALUES (1);")
        .unwrap();
    // ...and the guest asks not to wait for it.
    let r = post_json(
        &exec,
        &json!({ "statements": ["PRAGMA busy_timeout = 0"], "sql": "INSERT INTO t VALUES (2)" }),
    );
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({ "error": "io", "message": "database is locked" })
    );
    other.execute_batch("ROLLBACK").unwrap();
}

#[test]
fn sqlite_open_transaction_is_rolled_back_when_the_instance_ends() {
    let state = TempDir::new("sqlite-tx");
    let host = start_probe(&state);
    let exec = format!("{}/sqlite/exec", host.base_url());
    post_json(&exec, &json!({ "sql": "CREATE TABLE t (x)" }));
    // Begin, insert, and end the request without COMMIT.
    let r = post_json(
        &exec,
        &json!({ "statements": ["BEGIN IMMEDIATE", "INSERT INTO t VALUES (1)"], "sql": "SELECT count(*) FROM t" }),
    );
    assert_eq!(r.json()["rows"], json!([[{ "integer": 1 }]]));
    // The next request (likely on the same pooled connection) sees nothing and is not blocked.
    for _ in 0..3 {
        let r = post_json(&exec, &json!({ "sql": "SELECT count(*) FROM t" }));
        assert_eq!(r.json()["rows"], json!([[{ "integer": 0 }]]));
        let r = post_json(
            &exec,
            &json!({ "statements": ["BEGIN IMMEDIATE"], "sql": "INSERT INTO t VALUES (2)" }),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

#[test]
fn sqlite_access_denied_and_no_such_database() {
    let state = TempDir::new("sqlite-denied");
    let host = start_probe(&state);
    let base = host.base_url();
    for url in [
        format!("{base}/sqlite/open?db=analytics"),
        format!("{base}/denied/sqlite/open?db=default"),
    ] {
        let r = get(&url);
        assert_eq!(
            (r.status, r.json()),
            (500, json!({ "error": "access-denied" })),
            "{url}"
        );
    }
    let r = post_json(
        &format!("{base}/denied/sqlite/exec"),
        &json!({ "sql": "SELECT 1" }),
    );
    assert_eq!(r.json(), json!({ "error": "access-denied" }));
    assert_eq!(
        get(&format!("{base}/sqlite/open?db=default")).text(),
        "opened"
    );
}

#[test]
fn variables_declared_undeclared_and_invalid() {
    let state = TempDir::new("vars");
    let host = start_probe(&state);
    let base = host.base_url();
    assert_eq!(
        get(&format!("{base}/vars/greeting")).text(),
        "hello from the manifest"
    );
    assert_eq!(get(&format!("{base}/vars/token")).text(), "test-token");
    assert_eq!(
        get(&format!("{base}/vars/composite")).text(),
        "hello from the manifest in eu!"
    );
    assert_eq!(get(&format!("{base}/vars/literal")).text(), "just text");

    // An application variable the component did not declare.
    let r = get(&format!("{base}/vars/region"));
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"], "undefined");
    // Declared by another component only.
    assert_eq!(
        get(&format!("{base}/denied/vars/greeting")).json()["error"],
        "undefined"
    );
    // Not a valid name at all.
    let r = get(&format!("{base}/vars/Greeting"));
    assert_eq!(r.json()["error"], "invalid-name");
    assert_eq!(
        get(&format!("{base}/vars/a__b")).json()["error"],
        "invalid-name"
    );
}

#[test]
fn variables_come_from_env_overrides_before_defaults() {
    let state = TempDir::new("vars-env");
    let host = spin_host::Host::start(
        probe_config(&state)
            .env("SPIN_VARIABLE_GREETING", "hi from env")
            .env("SPIN_VARIABLE_REGION", "us"),
    )
    .unwrap();
    let base = host.base_url();
    assert_eq!(get(&format!("{base}/vars/greeting")).text(), "hi from env");
    assert_eq!(
        get(&format!("{base}/vars/composite")).text(),
        "hi from env in us!"
    );
}

fn guest_now_ms(base: &str) -> i64 {
    get(&format!("{base}/time")).json()["unixMs"]
        .as_i64()
        .unwrap()
}

fn real_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn clock_offset_moves_the_guests_wall_clock() {
    let state = TempDir::new("clock");
    let host = start_probe(&state);
    let base = host.base_url();
    let slack = 5_000;

    assert!((guest_now_ms(&base) - real_now_ms()).abs() < slack);

    host.set_clock_offset(TimeDelta::days(3));
    assert_eq!(host.clock_offset(), TimeDelta::days(3));
    let ahead = guest_now_ms(&base) - real_now_ms();
    assert!((ahead - 3 * 86_400_000).abs() < slack, "{ahead}");

    host.set_clock_offset(TimeDelta::minutes(-90));
    let behind = guest_now_ms(&base) - real_now_ms();
    assert!((behind + 90 * 60_000).abs() < slack, "{behind}");

    host.set_clock_offset(TimeDelta::zero());
    assert!((guest_now_ms(&base) - real_now_ms()).abs() < slack);
}

#[test]
fn clock_offset_from_config() {
    let state = TempDir::new("clock-config");
    let host =
        spin_host::Host::start(probe_config(&state).clock_offset(TimeDelta::hours(-1))).unwrap();
    let delta = guest_now_ms(&host.base_url()) - real_now_ms();
    assert!((delta + 3_600_000).abs() < 5_000, "{delta}");
}

#[test]
fn component_output_goes_to_log_files() {
    let state = TempDir::new("logs");
    let host = start_probe(&state);
    assert_eq!(
        get(&format!("{}/log?msg=first+line", host.base_url())).status,
        200
    );
    get(&format!("{}/log?msg=second%20line", host.base_url()));
    let logs = state.path().join("logs");
    let stdout = std::fs::read_to_string(logs.join("probe_stdout.txt")).unwrap();
    let stderr = std::fs::read_to_string(logs.join("probe_stderr.txt")).unwrap();
    assert_eq!(stdout, "first line\nsecond line\n");
    assert_eq!(stderr, "first line\nsecond line\n");
    assert!(logs.join("probe-nostores_stdout.txt").is_file());
}

#[test]
fn a_trapping_component_is_a_500_and_the_host_keeps_serving() {
    let state = TempDir::new("panic");
    let host = start_probe(&state);
    let r = get(&format!("{}/panic", host.base_url()));
    assert_eq!(r.status, 500);
    let stderr = std::fs::read_to_string(state.path().join("logs/probe_stderr.txt")).unwrap();
    assert!(stderr.contains("the probe was asked to panic"), "{stderr}");
    assert_eq!(get(&format!("{}/hello", host.base_url())).text(), "hello");
}

#[test]
fn concurrent_requests_each_get_a_fresh_instance() {
    let state = TempDir::new("concurrent");
    let host = start_probe(&state);
    let base = host.base_url();
    std::thread::scope(|s| {
        for t in 0..8 {
            let base = base.clone();
            s.spawn(move || {
                for i in 0..10 {
                    let key = format!("t{t}-{i}");
                    assert_eq!(
                        post(format!("{base}/kv/set?key={key}").as_str(), key.as_bytes()).status,
                        200
                    );
                    assert_eq!(get(&format!("{base}/kv/get?key={key}")).text(), key);
                }
            });
        }
    });
    assert_eq!(
        get(&format!("{base}/kv/keys"))
            .json()
            .as_array()
            .unwrap()
            .len(),
        80
    );
}

#[test]
fn a_busy_guest_does_not_starve_other_requests() {
    let state = TempDir::new("busy");
    let host = start_probe(&state);
    let base = host.base_url();
    let finished = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        // More busy guests than the host has worker threads. Proven by the order of events,
        // not by a duration: `hello` is answered while every busy guest is still running.
        let busy: Vec<_> = (0..4)
            .map(|_| {
                let (base, finished) = (base.clone(), &finished);
                s.spawn(move || {
                    let reply = get(&format!("{base}/busy?ms=3000"));
                    finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    reply
                })
            })
            .collect();
        // A head start for the busy guests (if they start late, the check is only weaker).
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(get(&format!("{base}/hello")).text(), "hello");
        let finished_before_hello = finished.load(std::sync::atomic::Ordering::SeqCst);
        for b in busy {
            assert_eq!(b.join().unwrap().status, 200);
        }
        assert_eq!(
            finished_before_hello, 0,
            "hello was answered only after a busy guest finished"
        );
    });
}

/// The probe app with its SQLite run in `mode`.
fn start_probe_in(state: &TempDir, mode: SqliteMode) -> Host {
    Host::start(probe_config(state).sqlite_mode(mode)).expect("the probe app starts")
}

#[test]
fn sqlite_attach_of_a_file_is_refused_as_spin_refuses_it() {
    for mode in [SqliteMode::Spin, SqliteMode::Tuned] {
        let state = TempDir::new(&format!("sqlite-attach-{mode}"));
        let host = start_probe_in(&state, mode);
        let exec = format!("{}/sqlite/exec", host.base_url());
        let elsewhere = state.path().join("elsewhere.db");
        let attach = format!("ATTACH DATABASE '{}' AS elsewhere", elsewhere.display());
        let r = post_json(&exec, &json!({ "sql": attach }));
        assert_eq!(
            (r.status, r.json()),
            (500, json!({ "error": "io", "message": "not authorized" })),
            "{mode}"
        );
        assert!(
            !elsewhere.exists(),
            "{mode}: the refused ATTACH made a file"
        );
        // A scratch database in memory is no file of anyone's: allowed, as in Spin.
        let r = post_json(
            &exec,
            &json!({ "statements": ["ATTACH DATABASE ':memory:' AS scratch"], "sql": "SELECT 1" }),
        );
        assert_eq!(r.status, 200, "{mode}: {}", r.text());
    }
}

#[test]
fn sqlite_statements_are_counted_per_request_and_under_the_write_lock() {
    for mode in [SqliteMode::Spin, SqliteMode::Tuned] {
        let state = TempDir::new(&format!("sqlite-count-{mode}"));
        let host = start_probe_in(&state, mode);
        let exec = format!("{}/sqlite/exec", host.base_url());
        let cost = |body: serde_json::Value| {
            let before = host.sqlite_statements();
            let r = post_json(&exec, &body);
            assert_eq!(r.status, 200, "{mode}: {}", r.text());
            let spent = host.sqlite_statements() - before;
            (spent.statements, spent.in_write_transaction)
        };
        assert_eq!(cost(json!({ "sql": "CREATE TABLE t (x)" })), (1, 0));
        assert_eq!(
            cost(json!({ "statements": ["PRAGMA user_version"], "sql": "SELECT count(*) FROM t" })),
            (2, 0)
        );
        // A write transaction: its BEGIN, both statements and its COMMIT hold the lock.
        assert_eq!(
            cost(json!({
                "statements": ["SELECT 1", "BEGIN IMMEDIATE", "SELECT count(*) FROM t", "INSERT INTO t VALUES (1)"],
                "sql": "COMMIT"
            })),
            (5, 4),
            "{mode}"
        );
        // A deferred transaction holds it from its first write.
        assert_eq!(
            cost(json!({
                "statements": ["BEGIN", "SELECT count(*) FROM t", "INSERT INTO t VALUES (2)"],
                "sql": "COMMIT"
            })),
            (4, 2),
            "{mode}"
        );
        // Nothing else ran: the host's count is the sum of the requests'.
        assert_eq!(
            host.sqlite_statements(),
            StatementCounts {
                statements: 12,
                in_write_transaction: 6
            },
            "{mode}"
        );
    }
}

#[test]
fn sqlite_counts_are_in_the_request_log() {
    let state = TempDir::new("sqlite-log");
    probe_wasm();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spin-host"))
        .args(["--manifest", probe_manifest().to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--state-dir", state.path().to_str().unwrap()])
        .env("SPIN_VARIABLE_API_TOKEN", "t")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("the host prints its address").unwrap();
        if let Some(url) = line.strip_prefix("Serving ") {
            break url.to_string();
        }
    };
    let r = post_json(
        &format!("{base}/sqlite/exec"),
        &json!({ "statements": ["CREATE TABLE t (x)", "BEGIN IMMEDIATE"], "sql": "COMMIT" }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let log = loop {
        let line = lines.next().expect("a request log line").unwrap();
        if line.starts_with("POST /sqlite/exec ") {
            break line;
        }
    };
    assert!(
        log.ends_with(" statements=3 in_write_tx=2"),
        "the log line ends with the request's statements: {log}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
