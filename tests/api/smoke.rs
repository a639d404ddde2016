//! The path end to end: health (one SQLite query, one key-value round trip) and the
//! OpenAPI document, without credentials.

use api_support::App;

#[test]
fn health_answers_through_sqlite_and_key_value() {
    let app = App::start();
    let health = app.anonymous().get("/v1/healthz").expect_status(200).json();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["checks"]["sqlite"], "ok");
    assert_eq!(health["checks"]["keyValue"], "ok");
    assert!(health["schemaVersion"].as_i64().unwrap() >= 1);
    let stored: String = app
        .db()
        .query_row(
            "SELECT name FROM sqlite_master WHERE name = 'reservations'",
            [],
            |r| r.get(0),
        )
        .expect("the components migrated the real database file");
    assert_eq!(stored, "reservations");
}

/// Replicas share one key-value store and a readiness probe asks each of them at once: every
/// check reads back its own value, and none leaves its probe behind.
#[test]
fn health_checks_at_once_on_replicas_sharing_a_key_value_store_are_all_ok() {
    let app = App::start();
    let replica = app.another_host();
    let bases = [app.base.clone(), replica.base_url()];
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let checks: Vec<_> = (0..8)
            .map(|n| {
                let base = bases[n % bases.len()].clone();
                scope.spawn(move || {
                    (0..10)
                        .map(|_| api_support::http::get(&format!("{base}/v1/healthz")).status)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        checks
            .into_iter()
            .flat_map(|check| check.join().expect("a health check"))
            .collect()
    });
    assert_eq!(statuses, vec![200; 80]);
    let probes_left = app
        .key_value_dump()
        .into_iter()
        .filter(|row| row.contains("healthz/probe"))
        .count();
    assert_eq!(probes_left, 0, "a health check left its probe behind");
}

/// A path that no route of spin.toml matches never reaches a component: Spin answers it
/// itself, with an empty 404.
#[test]
fn unknown_route_is_spins_empty_404() {
    let app = App::start();
    let reply = app.anonymous().get("/v1/no-such-thing");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("content-type"), None);
    assert!(reply.body.is_empty(), "{}", reply.text());
}
