//! What a listing costs when most of the database is not the caller's: an org's first page
//! of the audit trail and of the events feed with `LISTING_FOREIGN_EVENTS` (default 300 000)
//! events of other orgs before it and `LISTING_FOREIGN_FEED_EVENTS` (default 100 000) more,
//! releases and reclaims of another org's reservation (the feed's actions, which it lists
//! only to those who may see them); an org's first page of VMs with `LISTING_FOREIGN_VMS`
//! (default 100 000) VMs of another org; and a page of the spot market with
//! `LISTING_STALE_UNITS` (default 10 000) released units of a cancelled reservation before
//! the units for sale.
//!
//! Each is measured two ways on the same database in the same run, natively over rusqlite:
//! through the store (the listings by `audit_visibility` and by the market's
//! `on_market` index), and with the statements that listed them before those indexes
//! (visibility filtered row by row with `json_each`; every VM of the platform checked in id
//! order; the market walked through every released unit). It prints the median of each, and
//! the ratio. `LISTING_KEEP_DB=1` keeps the database for a look at the query plans.
//!
//! `cargo run --release -p gpu-bench --bin listing-cost`

use std::time::{Duration, Instant};

use anyhow::anyhow;
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::vm::Tier;
use reservations_store::audit::{AuditFilter, FEED_ACTIONS};
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::vms::{NewVm, VmFilter};
use reservations_store::{Context, Store};

const NEWCOMER: &str = "newcomer";
const OWNER: &str = "owner";
const MARKET_NODE: &str = "mk";
/// A node whose releases and reclaims the newcomer may not see.
const FOREIGN_NODE: &str = "fx";
const FOR_SALE: usize = 100;
const RUNS: usize = 30;

/// The audit listing's statement before `audit_visibility`: every event from the cursor on,
/// its visibility read from its JSON lists.
const AUDIT_BEFORE: &str = "SELECT seq FROM audit_events WHERE seq > ?1 \
     AND (EXISTS (SELECT 1 FROM json_each(audit_events.visible_to) WHERE value = ?2) \
       OR EXISTS (SELECT 1 FROM json_each(audit_events.vm_owners) \
                  WHERE json_extract(value, '$.orgId') = ?2)) \
     ORDER BY seq LIMIT 2";

/// The feed's statement before it: the same, for the feed's actions.
const FEED_BEFORE: &str = "SELECT seq FROM audit_events WHERE seq > ?1 \
     AND (EXISTS (SELECT 1 FROM json_each(audit_events.visible_to) WHERE value = ?2) \
       OR EXISTS (SELECT 1 FROM json_each(audit_events.vm_owners) \
                  WHERE json_extract(value, '$.orgId') = ?2)) \
     AND action IN ('reservation.release', 'reservation.reclaim', 'vm.place', 'vm.terminate') \
     ORDER BY seq LIMIT 2";

/// The VM listing's statement before it walked what the org may see: every VM from the
/// cursor on, each checked for being the org's own or on a reservation it owns or manages.
const VMS_BEFORE: &str = "SELECT v.id FROM vms v WHERE v.id > ?1 \
     AND (v.org_id = ?2 OR EXISTS ( \
       SELECT 1 FROM vm_units vu \
       JOIN reservation_units ru ON ru.node_id = vu.node_id AND ru.unit_id = vu.unit_id \
       JOIN reservations r ON r.id = ru.reservation_id JOIN nodes n ON n.id = r.node_id \
       WHERE vu.vm_id = v.id AND r.state = 'live' AND (n.owner_org_id = ?2 OR EXISTS ( \
         SELECT 1 FROM json_each(r.managing_org_ids) WHERE value = ?2)))) \
     ORDER BY v.id LIMIT 2";

/// The market's statement before `on_market`: every released unit, cancelled or not.
const MARKET_BEFORE: &str = "SELECT ru.unit_id FROM reservation_units ru \
     INDEXED BY reservation_units_released CROSS JOIN reservations r ON r.id = ru.reservation_id \
     WHERE ru.node_id = ?1 AND ru.unit_id > '' AND ru.released = 1 \
       AND (ru.released_until IS NULL OR ru.released_until > ?2) AND r.state = 'live' \
       AND r.starts_at <= ?2 AND (r.ends_at IS NULL OR r.ends_at > ?2) \
     ORDER BY ru.node_id, ru.unit_id LIMIT 101";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median time of a statement and the rows it gave.
type Measured = (Duration, usize);

fn median(mut run: impl FnMut() -> anyhow::Result<usize>) -> anyhow::Result<Measured> {
    let mut times = Vec::with_capacity(RUNS);
    let mut rows = 0;
    for _ in 0..RUNS {
        let started = Instant::now();
        rows = run()?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok((times[RUNS / 2], rows))
}

fn main() -> anyhow::Result<()> {
    let foreign_events = knob("LISTING_FOREIGN_EVENTS", 300_000);
    let foreign_feed_events = knob("LISTING_FOREIGN_FEED_EVENTS", 100_000);
    let foreign_vms = knob("LISTING_FOREIGN_VMS", 100_000);
    let stale_units = knob("LISTING_STALE_UNITS", 10_000);
    let dir = std::env::temp_dir().join(format!("listing-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = NativeDb::open(dir.join("db.sqlite")).map_err(|e| anyhow!("{e}"))?;
    let store = Store::open(&db).map_err(|e| anyhow!("{e}"))?;
    db.connection().execute_batch("PRAGMA synchronous = OFF")?;
    let operator = Caller::operator("bench");
    let now = chrono::Utc::now();
    let ctx = Context::new(&operator, now, "bench");
    let fail = |e: reservations_store::StoreError| anyhow!("{e}");

    let started = Instant::now();
    store
        .identity()
        .create_org(&ctx, OWNER, "Owner")
        .map_err(fail)?;
    for i in 0..foreign_events {
        store
            .identity()
            .create_org(&ctx, &format!("org-{i:07}"), "Other")
            .map_err(fail)?;
    }
    store
        .identity()
        .create_org(&ctx, NEWCOMER, "Newcomer")
        .map_err(fail)?;
    foreign_capacity_changes(&store, &ctx, foreign_feed_events).map_err(fail)?;
    foreign_vms_placed(&store, &ctx, foreign_vms).map_err(fail)?;
    let units: Vec<String> = (0..stale_units + FOR_SALE)
        .map(|i| format!("u{i:06}"))
        .collect();
    store
        .capacity()
        .put_node(&ctx, MARKET_NODE, OWNER, &units)
        .map_err(fail)?;
    let (stale, live) = units.split_at(stale_units);
    for (id, units) in [("r-stale", stale), ("r-live", live)] {
        reserve(&store, &ctx, MARKET_NODE, id, units, NEWCOMER).map_err(fail)?;
        for chunk in units.chunks(1_000) {
            store
                .capacity()
                .change_capacity(
                    &ctx,
                    CapacityChange {
                        action: CapacityAction::Release,
                        node_id: MARKET_NODE,
                        reservation_id: id,
                        unit_ids: chunk,
                        reason: None,
                        representation: Representation::Minimal,
                        notice_seconds: None,
                        until: None,
                    },
                )
                .map_err(fail)?;
        }
    }
    store
        .capacity()
        .cancel_reservation(&ctx, MARKET_NODE, "r-stale", None)
        .map_err(fail)?;
    // The index the market walked before `on_market`, for the baseline's statement.
    db.connection().execute_batch(
        "CREATE INDEX reservation_units_released ON reservation_units(node_id, unit_id) \
         WHERE released = 1; ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);",
    )?;
    eprintln!(
        "{foreign_events} foreign events, {foreign_feed_events} foreign releases and reclaims, \
         {foreign_vms} foreign VMs, \
         {stale_units} stale released units: built in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let head = store.latest_position().map_err(fail)?;
    let connection = db.connection();
    let before = |sql: &str, after: i64| -> anyhow::Result<usize> {
        let mut statement = connection.prepare_cached(sql)?;
        let rows = statement
            .query_map(rusqlite::params![after, NEWCOMER], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })?
            .count();
        Ok(rows)
    };
    let after = |actions: &'static [&'static str], after: i64| -> anyhow::Result<usize> {
        let page = store
            .trail()
            .list_audit(&AuditFilter {
                visible_to_org: Some(NEWCOMER.to_owned()),
                after_seq: Some(after),
                actions,
                limit: 1,
                ..AuditFilter::default()
            })
            .map_err(fail)?;
        Ok(page.items.len())
    };
    let now_ms = now.timestamp_millis();
    let rows: Vec<(&str, Measured, Measured)> = vec![
        (
            "audit, first page (limit 1)",
            median(|| before(AUDIT_BEFORE, 0))?,
            median(|| after(&[], 0))?,
        ),
        (
            "audit, resumed at the head",
            median(|| before(AUDIT_BEFORE, head))?,
            median(|| after(&[], head))?,
        ),
        (
            "events feed, first page (none of the foreign releases visible)",
            median(|| before(FEED_BEFORE, 0))?,
            median(|| after(FEED_ACTIONS, 0))?,
        ),
        (
            "VMs, first page (limit 1; none of the foreign VMs visible)",
            median(|| before(VMS_BEFORE, 0))?,
            median(|| {
                let newcomer = Caller {
                    key_id: "key-newcomer".into(),
                    org_id: Some(NEWCOMER.to_owned()),
                    permissions: Role::Member.permissions(),
                };
                let page = store
                    .capacity()
                    .list_vms(
                        &Context::new(&newcomer, now, "bench"),
                        &VmFilter {
                            node_id: None,
                            status: None,
                            after: None,
                            limit: 1,
                        },
                    )
                    .map_err(fail)?;
                Ok(page.items.len())
            })?,
        ),
        (
            "market page (100 units for sale)",
            median(|| {
                let mut statement = connection.prepare_cached(MARKET_BEFORE)?;
                Ok(statement
                    .query_map(rusqlite::params![MARKET_NODE, now_ms], |r| {
                        r.get::<_, String>(0)
                    })?
                    .count())
            })?,
            median(|| {
                Ok(store
                    .market()
                    .offers(Some(MARKET_NODE), None, FOR_SALE, now)
                    .map_err(fail)?
                    .items
                    .len())
            })?,
        ),
    ];
    println!("| listing | before | after | before / after |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, (before, before_rows), (after, after_rows)) in rows {
        println!(
            "| {name} | {:.3} ms ({before_rows} rows) | {:.3} ms ({after_rows} rows) | {:.1}× |",
            before.as_secs_f64() * 1e3,
            after.as_secs_f64() * 1e3,
            before.as_secs_f64() / after.as_secs_f64().max(1e-9)
        );
    }
    if std::env::var_os("LISTING_KEEP_DB").is_some() {
        eprintln!("the database is kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `count` releases and reclaims, in turn, of one unit of a reservation of `OWNER`'s for
/// another org: events of the feed's actions that the newcomer may not see.
fn foreign_capacity_changes(
    store: &Store<'_>,
    ctx: &Context<'_>,
    count: usize,
) -> Result<(), reservations_store::StoreError> {
    let unit = ["f0".to_owned()];
    store
        .identity()
        .create_org(ctx, "foreign-tenant", "Foreign tenant")?;
    store.capacity().put_node(ctx, FOREIGN_NODE, OWNER, &unit)?;
    reserve(
        store,
        ctx,
        FOREIGN_NODE,
        "r-foreign",
        &unit,
        "foreign-tenant",
    )?;
    for i in 0..count {
        let action = if i % 2 == 0 {
            CapacityAction::Release
        } else {
            CapacityAction::Reclaim
        };
        store.capacity().change_capacity(
            ctx,
            CapacityChange {
                action,
                node_id: FOREIGN_NODE,
                reservation_id: "r-foreign",
                unit_ids: &unit,
                reason: None,
                representation: Representation::Minimal,
                notice_seconds: None,
                until: None,
            },
        )?;
    }
    Ok(())
}

/// Reserves `units` of `node` for `audience`, open-ended, from an hour before `ctx.now`.
fn reserve(
    store: &Store<'_>,
    ctx: &Context<'_>,
    node: &str,
    id: &str,
    units: &[String],
    audience: &str,
) -> Result<(), reservations_store::StoreError> {
    store.capacity().create_reservation(
        ctx,
        node,
        id,
        &NewReservation {
            reserved_unit_ids: units.to_vec(),
            allowed_org_ids: vec![audience.to_owned()],
            managing_org_ids: Vec::new(),
            term: Term {
                starts_at: ctx.now - chrono::TimeDelta::hours(1),
                ends_at: None,
            },
            contract_ref: None,
            reason: None,
        },
    )?;
    Ok(())
}

/// `count` VMs of another org, each on its own free unit of a node of `OWNER`'s.
fn foreign_vms_placed(
    store: &Store<'_>,
    ctx: &Context<'_>,
    count: usize,
) -> Result<(), reservations_store::StoreError> {
    let units: Vec<String> = (0..count).map(|i| format!("v{i:07}")).collect();
    store.capacity().put_node(ctx, "fv", OWNER, &units)?;
    let tenant = Caller {
        key_id: "key-foreign-tenant".into(),
        org_id: Some("foreign-tenant".to_owned()),
        permissions: Role::Member.permissions(),
    };
    let ctx = Context::new(&tenant, ctx.now, "bench");
    for (i, unit) in units.iter().enumerate() {
        store.capacity().place_vm(
            &ctx,
            NewVm {
                id: &format!("vm-{i:07}"),
                node_id: "fv",
                unit_ids: std::slice::from_ref(unit),
                tier: Tier::Community,
            },
        )?;
    }
    Ok(())
}
