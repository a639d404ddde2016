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
