//! A damaged stored row never takes a listing down: each column of each table a listing
//! reads (who sees which event included) is given, one at a time, a value of the wrong type (a blob) and, for text columns,
//! malformed JSON, written to the app's database behind its back. Every listing still answers
//! 200; operators are told the row's key under `unreadable`, orgs never see it.

use serde_json::{Value, json};

use api_support::{App, Client, asks_for_retry};

/// A table, the row of it to damage (a `WHERE` clause), the listings that read it, and
/// whether operators are told of the damage (a damaged row of who-sees-what only hides an
/// event from that org: operators read the trail itself).
struct Damaged {
    table: &'static str,
    row: String,
    listings: &'static [&'static str],
    operators_told: bool,
}

fn damaged(table: &'static str, row: &str, listings: &'static [&'static str]) -> Damaged {
    Damaged {
        table,
        row: row.to_owned(),
        listings,
        operators_told: true,
    }
}

/// Every table a listing reads, each with a row `app` holds.
fn tables(app: &App) -> Vec<Damaged> {
    let owners_newest_event: i64 = app
        .db()
        .query_row(
            "SELECT MAX(seq) FROM audit_visibility WHERE org_id = 'owner'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    vec![
        damaged("nodes", "id = 'n1'", &["/v1/nodes"]),
        damaged(
            "reservations",
            "node_id = 'n1'",
            &["/v1/nodes/n1/reservations"],
        ),
        damaged(
            "reservation_units",
            "unit_id = 'g0'",
            &["/v1/nodes/n1/reservations", "/v1/market"],
        ),
        damaged("vms", "node_id = 'n1'", &["/v1/vms"]),
        damaged("vm_units", "unit_id = 'g1'", &["/v1/vms"]),
        damaged("api_keys", "name = 'spare'", &["/v1/orgs/owner/keys"]),
        damaged("operator_keys", "name = 'spare'", &["/v1/operator/keys"]),
        damaged(
            "audit_events",
            "action = 'vm.place'",
            &["/v1/audit", "/v1/events"],
        ),
        Damaged {
            operators_told: false,
            ..damaged(
                "audit_visibility",
                &format!("org_id = 'owner' AND seq = {owners_newest_event}"),
                &["/v1/audit", "/v1/events"],
            )
        },
    ]
}

fn columns(app: &App, table: &str) -> Vec<String> {
    let db = app.db();
    let mut statement = db
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .unwrap();
    statement
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Drops the triggers on `table`, and gives back the statements that create them again.
fn set_triggers_aside(db: &rusqlite::Connection, table: &str) -> Vec<String> {
    let triggers: Vec<(String, String)> = db
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1")
        .unwrap()
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (name, _) in &triggers {
        db.execute_batch(&format!("DROP TRIGGER \"{name}\""))
            .unwrap();
    }
    triggers
        .into_iter()
        .map(|(_, sql)| format!("{sql};"))
        .collect()
}

fn unreadable_items(page: &Value) -> usize {
    page["items"].as_array().map_or(0, |items| {
        items.iter().filter(|i| i["unreadable"] == true).count()
    })
}

/// A listing's page, which must answer 200 whatever is damaged. The test damages rows by
/// writing to the database file itself, behind the back of a sqld serving it, which can find
/// its database busy for a moment: such an answer says to retry, and is retried.
fn listed(client: &Client, path: &str, what: &str) -> Value {
    let mut reply = client.get(path);
    for _ in 0..10 {
        if !asks_for_retry(reply.status, &reply.body) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        reply = client.get(path);
    }
    assert_eq!(reply.status, 200, "{what}: {path}: {}", reply.text());
    reply.json()
}

/// Every listing as the operator and as the owner org's admin: all 200; the owner's never
/// names an unreadable row. Whether the operator was told of one.
fn listings_answer(operator: &Client, owner: &Client, paths: &[&str], what: &str) -> bool {
    let mut told = false;
    for path in paths {
        let body = listed(operator, path, what);
        if let Some(unreadable) = body.get("unreadable") {
            assert!(
                unreadable[0]["key"].is_string() && unreadable[0]["detail"].is_string(),
                "{what}: {path}: {body}"
            );
            told = true;
        }
        // The audit listings name a damaged event in place, by its sequence number.
        told |= unreadable_items(&body) > 0;
        if path.starts_with("/v1/operator/") {
            continue; // operators alone list operator keys
        }
        let body = listed(owner, path, what);
        assert!(
            body.get("unreadable").is_none() && unreadable_items(&body) == 0,
            "{what}: {path}: an org was told of a damaged row: {body}"
        );
    }
    told
}

/// Writes `damage` into `column` of the row: how many rows changed, or `None` when the
/// database refused it by a constraint or a guard. A busy database (a sqld serving the file) is
/// waited for; any other failure fails the test.
fn damage_row(
    db: &rusqlite::Connection,
    table: &str,
    column: &str,
    row: &str,
    damage: &str,
) -> Option<usize> {
    let statement = format!("UPDATE {table} SET \"{column}\" = {damage} WHERE {row}");
    for _ in 0..50 {
        match db.execute(&statement, []) {
            Ok(changed) => return Some(changed),
            // A constraint or guard, or a rowid that must be an integer.
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::ConstraintViolation | rusqlite::ErrorCode::TypeMismatch
                ) =>
            {
                return None;
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => panic!("{statement}: {e}"),
        }
    }
    panic!("{statement}: the database stayed busy")
}

#[test]
fn a_damaged_column_of_any_listed_table_is_reported_to_operators_and_skipped_for_orgs() {
    let app = App::start_on_one_database();
    app.org("owner");
    app.org("aud");
    app.node("n1", "owner", &["g0", "g1", "g2"]);
    let reservation = app.reservation("n1", &["g0", "g1"], &["aud"], &[]);
    let owner = app.key("owner", "admin", None);
    let audience = app.key("aud", "member", None);
    owner
        .post(
            &format!(
                "/v1/nodes/n1/reservations/{}/release",
                reservation["id"].as_str().unwrap()
            ),
            &json!({ "unitIds": ["g0", "g1"] }),
        )
        .expect_status(200);
    audience
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["g1"], "tier": "spot" }),
        )
        .expect_status(201);
    // A key of the owner's to damage, beside the one the owner lists with.
    owner
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "spare", "role": "viewer" }),
        )
        .expect_status(201);
    let operator = app.operator();
    operator
        .post("/v1/operator/keys", &json!({ "name": "spare" }))
        .expect_status(201);
    for Damaged {
        table,
        row,
        listings: paths,
        operators_told,
    } in tables(&app)
    {
        assert!(
            !listings_answer(&operator, &owner, paths, "undamaged"),
            "{table}: unreadable before any damage"
        );
        let mut reported = Vec::new();
        let mut landed = Vec::new();
        for column in columns(&app, table) {
            let db = app.db();
            let original: Vec<(i64, rusqlite::types::Value)> = {
                let mut statement = db
                    .prepare(&format!(
                        "SELECT rowid, \"{column}\" FROM {table} WHERE {row}"
                    ))
                    .or_else(|_| {
                        // A table without rowid: its rows are put back by their values.
                        db.prepare(&format!("SELECT 0, \"{column}\" FROM {table} WHERE {row}"))
                    })
                    .unwrap();
                statement
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            };
            assert!(!original.is_empty(), "{table}: no row where {row}");
            for damage in ["X'00ff'", "'{not json'"] {
                let what = format!("{table}.{column} = {damage}");
                // Constraints (types checked, NOT NULL, foreign data) may refuse the damage:
                // then the database itself keeps the row readable. Anything else is a failure.
                let Some(changed) = damage_row(&db, table, &column, &row, damage) else {
                    continue;
                };
                let holding: i64 = db
                    .query_row(
                        &format!("SELECT COUNT(*) FROM {table} WHERE \"{column}\" IS {damage}"),
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert!(
                    changed > 0 && holding > 0,
                    "{what}: the damage did not land ({changed} rows changed, {holding} hold it)"
                );
                landed.push(what.clone());
                if listings_answer(&operator, &owner, paths, &what) {
                    reported.push(what.clone());
                }
                // Put back, the same row by the same condition (the damage may have moved it
                // out of `row`: then by its rowid, or by the damaged value), with the table's
                // triggers set aside: a guard may refuse to undo what it never let happen.
                let triggers = set_triggers_aside(&db, table);
                let restored = original.iter().all(|(rowid, value)| {
                    db.execute(
                        &format!(
                            "UPDATE {table} SET \"{column}\" = ?1 \
                             WHERE ({row} OR rowid = ?2 OR \"{column}\" = {damage})"
                        ),
                        rusqlite::params![value, rowid],
                    )
                    .or_else(|_| {
                        db.execute(
                            &format!(
                                "UPDATE {table} SET \"{column}\" = ?1 \
                                 WHERE ({row} OR \"{column}\" = {damage})"
                            ),
                            rusqlite::params![value],
                        )
                    })
                    .is_ok()
                });
                for trigger in triggers {
                    db.execute_batch(&trigger).unwrap();
                }
                assert!(restored, "{what}: could not be put back");
            }
        }
        assert!(
            !landed.is_empty(),
            "{table}: the database refused every damage"
        );
        assert_eq!(
            !reported.is_empty(),
            operators_told,
            "{table}: damaged columns reported to operators: {reported:?}"
        );
        assert!(
            !listings_answer(&operator, &owner, paths, "restored"),
            "{table}: still unreadable once put back"
        );
    }
}
