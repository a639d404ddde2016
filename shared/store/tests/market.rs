//! The spot market over a real SQLite file: exactly the released, idle units of active
//! reservations are for sale, a page walks the partial index from its cursor, and the
//! node's count agrees with the listing.

use chrono::TimeDelta;

use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::market::{Offer, parse_cursor};
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::time::from_millis;
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::reservations::ReservationFilter;
use reservations_store::vms::NewVm;
use reservations_store::{Context, Store};

fn t0() -> Timestamp {
    from_millis(1_800_000_000_000)
}

fn units(list: &[&str]) -> Vec<String> {
    list.iter().map(|u| u.to_string()).collect()
}

fn at(caller: &Caller, now: Timestamp) -> Context<'_> {
    Context {
        caller,
        now,
        request_id: "req",
        client_request_id: None,
    }
}

fn reserve(store: &Store<'_>, ctx: &Context<'_>, node: &str, id: &str, list: &[&str], term: Term) {
    store
        .capacity()
        .create_reservation(
            ctx,
            node,
            id,
            &NewReservation {
                reserved_unit_ids: units(list),
                allowed_org_ids: vec!["aud".into()],
                managing_org_ids: Vec::new(),
                term,
                contract_ref: Some("secret-contract".into()),
                reason: Some("secret reason".into()),
            },
        )
        .expect("reservation");
}

fn release(store: &Store<'_>, ctx: &Context<'_>, node: &str, id: &str, list: &[&str]) {
    store
        .capacity()
        .change_capacity(
            ctx,
            CapacityChange {
                action: CapacityAction::Release,
                node_id: node,
                reservation_id: id,
                unit_ids: &units(list),
                reason: None,
                representation: Representation::Minimal,
                notice_seconds: None,
                until: None,
            },
        )
        .expect("release");
}

/// The buyer org's spot VM `vm-spot` on `unit` of n1, placed at `when`.
fn place_spot_vm(store: &Store<'_>, when: Timestamp, unit: &str) {
    let buyer = Caller {
        key_id: "key-buyer".into(),
        org_id: Some("buyer".into()),
        permissions: Role::Member.permissions(),
    };
    store
        .capacity()
        .place_vm(
            &at(&buyer, when),
            NewVm {
                id: "vm-spot",
                node_id: "n1",
                unit_ids: &units(&[unit]),
                tier: Tier::Spot,
            },
        )
        .unwrap();
}

fn listed(page: &[Offer]) -> Vec<String> {
    page.iter()
        .map(|o| format!("{}/{}", o.node_id, o.unit_id))
        .collect()
}

#[test]
fn exactly_the_idle_released_units_of_active_reservations_are_for_sale() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db")).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    let now = t0();
    let ctx = at(&operator, now - TimeDelta::hours(3));
    for org in ["owner", "aud", "buyer"] {
        store.identity().create_org(&ctx, org, org).unwrap();
    }
    let n1: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
    store.capacity().put_node(&ctx, "n1", "owner", &n1).unwrap();
    store
        .capacity()
        .put_node(&ctx, "n2", "owner", &units(&["v0", "v1", "v2"]))
        .unwrap();
    let ends = now + TimeDelta::hours(5);
    // Active A on n1 (u0..u5), ending at `ends`; u0..u3 released, a spot VM on u1.
    reserve(
        &store,
        &ctx,
        "n1",
        "rsv-a",
        &["u0", "u1", "u2", "u3", "u4", "u5"],
        Term {
            starts_at: now - TimeDelta::hours(2),
            ends_at: Some(ends),
        },
    );
    let at_now = at(&operator, now - TimeDelta::minutes(10));
    release(&store, &at_now, "n1", "rsv-a", &["u0", "u1", "u2", "u3"]);
    place_spot_vm(&store, now - TimeDelta::minutes(5), "u1");
    // Open-ended B on n2 (v0 released); C on n2 ends a minute before `now` (v1 released);
    // D on n1 (u6 released) is cancelled.
    reserve(
        &store,
        &ctx,
        "n2",
        "rsv-b",
        &["v0"],
        Term {
            starts_at: now - TimeDelta::hours(2),
            ends_at: None,
        },
    );
    release(&store, &at_now, "n2", "rsv-b", &["v0"]);
    reserve(
        &store,
        &ctx,
        "n2",
        "rsv-c",
        &["v1", "v2"],
        Term {
            starts_at: now - TimeDelta::hours(2),
            ends_at: Some(now - TimeDelta::minutes(1)),
        },
    );
    release(&store, &at_now, "n2", "rsv-c", &["v1"]);
    reserve(
        &store,
        &ctx,
        "n1",
        "rsv-d",
        &["u6"],
        Term {
            starts_at: now - TimeDelta::hours(2),
            ends_at: None,
        },
    );
    release(&store, &at_now, "n1", "rsv-d", &["u6"]);
    store
        .capacity()
        .cancel_reservation(&at_now, "n1", "rsv-d", None)
        .unwrap();

    // At `now`: C has expired, D is cancelled, u1 is busy.
    let all = store.market().offers(None, None, 100, now).unwrap();
    assert_eq!(listed(&all.items), ["n1/u0", "n1/u2", "n1/u3", "n2/v0"]);
    assert_eq!(all.next_cursor, None);
    assert_eq!(all.items[0].until, Some(ends));
    assert_eq!(all.items[3].until, None);
    assert_eq!(store.market().units_for_sale("n1", now).unwrap(), 3);
    assert_eq!(store.market().units_for_sale("n2", now).unwrap(), 1);

    // Pages of one walk the same list; the node filter keeps to one node.
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let after = cursor
            .as_deref()
            .map(|c| parse_cursor(c).expect("a cursor"));
        let page = store.market().offers(None, after, 1, now).unwrap();
        walked.extend(listed(&page.items));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(walked, listed(&all.items));
    let n1_only = store.market().offers(Some("n1"), None, 2, now).unwrap();
    assert_eq!(listed(&n1_only.items), ["n1/u0", "n1/u2"]);
    let cursor = n1_only.next_cursor.expect("more on n1");
    let rest = store
        .market()
        .offers(Some("n1"), parse_cursor(&cursor), 2, now)
        .unwrap();
    assert_eq!(listed(&rest.items), ["n1/u3"]);
    assert_eq!(rest.next_cursor, None);
    assert!(
        store
            .market()
            .offers(Some("n2"), Some(("n3", "x")), 2, now)
            .unwrap()
            .items
            .is_empty()
    );

    // Before A started nothing of it was for sale (it was pending).
    assert_eq!(
        store
            .market()
            .units_for_sale("n1", now - TimeDelta::hours(3))
            .unwrap(),
        0
    );
    // After A ends, its units leave the market.
    assert_eq!(store.market().units_for_sale("n1", ends).unwrap(), 0);
}

/// Whatever the statistics, the listing and the count walk the partial index of released
/// units from the cursor without a sort and probe everything else by key: no table is
/// scanned, even with many reservations on the node and ANALYZE run.
#[test]
fn the_listing_walks_the_partial_index_of_released_units() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db")).unwrap();
    let _store = Store::open(&db).unwrap();
    let connection = db.connection();
    connection
        .execute_batch(
            "INSERT INTO orgs VALUES ('o', 'o', 0);
             INSERT INTO nodes VALUES ('n1', 'o', 1, 0, 0, 0);",
        )
        .unwrap();
    for i in 0..300 {
        connection
            .execute(
                "INSERT INTO reservations VALUES (?1, 'n1', 'live', 0, 1, '[]', '[]', NULL, NULL, 1, 0, 0)",
                [format!("r{i}")],
            )
            .unwrap();
        connection
            .execute(
                "INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released) VALUES (?1, 0, 'n1', ?2, ?3)",
                rusqlite::params![format!("r{i}"), format!("u{i:03}"), i % 3 == 0],
            )
            .unwrap();
    }
    connection.execute_batch("ANALYZE").unwrap();
    for sql in [
        reservations_store::market::listing_sql(true),
        reservations_store::market::listing_sql(false),
        reservations_store::market::count_sql(),
    ] {
        let mut statement = connection
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let parameters = statement.parameter_count();
        let values: Vec<rusqlite::types::Value> = (0..parameters)
            .map(|_| rusqlite::types::Value::Text(String::new()))
            .collect();
        let plan: Vec<String> = statement
            .query_map(rusqlite::params_from_iter(values), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("; ");
        assert!(
            plan.contains("reservation_units_on_market")
                && plan.contains("reservations_needs_review")
                && !plan.contains("SCAN")
                && !plan.contains("TEMP B-TREE"),
            "{sql}\n{plan}"
        );
    }
    // Every write's sweep (the trigger of `writes`) walks only the units whose time is out.
    let plan: Vec<String> = connection
        .prepare(
            "EXPLAIN QUERY PLAN UPDATE reservation_units SET on_market = 0 \
             WHERE on_market = 1 AND market_ends_at <= ?1",
        )
        .unwrap()
        .query_map([0], |row| row.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let plan = plan.join("; ");
    assert!(
        plan.contains("reservation_units_market_ends") && !plan.contains("SCAN"),
        "{plan}"
    );
}

/// A node update answers how many of its units are for sale from its own plan, and that
/// count is the one the market reads once the update is made: with its units unchanged,
/// with a new owner, with a unit added (every live reservation withheld for review), and
/// after one of them is re-affirmed while another, holding a unit it shares, is still
/// withheld.
#[test]
fn a_node_update_answers_the_units_for_sale_the_market_then_counts() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db")).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    let now = t0();
    let ctx = at(&operator, now - TimeDelta::hours(3));
    for org in ["owner", "other", "aud", "buyer"] {
        store.identity().create_org(&ctx, org, org).unwrap();
    }
    let node_units = units(&["u0", "u1", "u2", "u3", "u4"]);
    store
        .capacity()
        .put_node(&ctx, "n1", "owner", &node_units)
        .unwrap();
    // Active A (u0..u3, released but u3; a spot VM on u1) ends before F (u2, u4) starts.
    let a_ends = now + TimeDelta::hours(1);
    reserve(
        &store,
        &ctx,
        "n1",
        "rsv-a",
        &["u0", "u1", "u2", "u3"],
        Term {
            starts_at: now - TimeDelta::hours(2),
            ends_at: Some(a_ends),
        },
    );
    reserve(
        &store,
        &ctx,
        "n1",
        "rsv-f",
        &["u2", "u4"],
        Term {
            starts_at: a_ends,
            ends_at: None,
        },
    );
    let at_now = at(&operator, now - TimeDelta::minutes(10));
    release(&store, &at_now, "n1", "rsv-a", &["u0", "u1", "u2"]);
    place_spot_vm(&store, now - TimeDelta::minutes(5), "u1");

    let at_now = at(&operator, now);
    let answered_as_counted = |owner: &str, list: &[String]| -> i64 {
        let written = store
            .capacity()
            .put_node(&at_now, "n1", owner, list)
            .unwrap();
        assert_eq!(
            written.units_for_sale,
            store.market().units_for_sale("n1", now).unwrap(),
            "owner {owner}, units {list:?}"
        );
        written.units_for_sale
    };
    assert_eq!(answered_as_counted("owner", &node_units), 2, "u0 and u2");
    assert_eq!(answered_as_counted("other", &node_units), 2, "a new owner");
    let mut grown = node_units.clone();
    grown.push("u5".into());
    assert_eq!(answered_as_counted("other", &grown), 0, "A and F withheld");
    store
        .capacity()
        .reaffirm_reservation(&at_now, "n1", "rsv-a", None, Some("checked"))
        .unwrap();
    // A is live again, but F, still withheld, holds u2 from everyone.
    assert_eq!(answered_as_counted("other", &grown), 1, "u0 only");
}

#[test]
fn a_release_and_a_reclaim_move_the_reservation_s_updated_at() {
    let dir = tempfile::tempdir().unwrap();
    let db = NativeDb::open(dir.path().join("db")).unwrap();
    let store = Store::open(&db).unwrap();
    let operator = Caller::operator("operator");
    let created = at(&operator, t0());
    for org in ["owner", "aud"] {
        store.identity().create_org(&created, org, org).unwrap();
    }
    store
        .capacity()
        .put_node(&created, "n1", "owner", &units(&["u0", "u1"]))
        .unwrap();
    let term = Term {
        starts_at: t0(),
        ends_at: None,
    };
    reserve(&store, &created, "n1", "rsv", &["u0", "u1"], term);
    let updated_at = |ctx: &Context<'_>| {
        store
            .capacity()
            .read_reservation(ctx, "n1", "rsv")
            .unwrap()
            .updated_at
    };
    assert_eq!(updated_at(&created), t0());

    let released = at(&operator, t0() + TimeDelta::minutes(1));
    release(&store, &released, "n1", "rsv", &["u0"]);
    assert_eq!(updated_at(&released), released.now);
    let reclaimed = at(&operator, t0() + TimeDelta::minutes(2));
    store
        .capacity()
        .change_capacity(
            &reclaimed,
            CapacityChange {
                action: CapacityAction::Reclaim,
                node_id: "n1",
                reservation_id: "rsv",
                unit_ids: &units(&["u0"]),
                reason: None,
                representation: Representation::Minimal,
                notice_seconds: None,
                until: None,
            },
        )
        .unwrap();
    assert_eq!(updated_at(&reclaimed), reclaimed.now);
    assert_eq!(
        store
            .capacity()
            .list_reservations(
                &reclaimed,
                "n1",
                &ReservationFilter {
                    statuses: Vec::new(),
                    after: None,
                    limit: 10,
                },
            )
            .unwrap()
            .items[0]
            .updated_at,
        reclaimed.now,
        "the listing shows it too"
    );
}
