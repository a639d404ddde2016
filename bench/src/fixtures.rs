//! The benchmark's data, written once through the native store (`reservations_store::Store`
//! over rusqlite: the same SQL, rules and audit chain as the components) into a template
//! SQLite file, which is then copied for the host and for the native baseline. 100 000 VM
//! placements through the API would take minutes; through the store they take seconds.
//!
//! - org `owner` owns every node; org `tenant` is the audience and runs the VMs;
//! - node `tp` (throughput): [`THROUGHPUT_UNITS`] units, all in reservation `r-tp`; releases
//!   take a fresh unit each, reclaims take them back in the same order;
//! - node `s<N>` per scale: N units, all in reservation `r-s<N>`, and a community VM of
//!   `tenant` on every unit but the first: unit 0 is released and reclaimed, unit 1 is the
//!   dry run's target (its VM would be skipped);
//! - nodes `sp00`…`sp31` (writes spread over nodes): [`SPREAD_UNITS`] units each, all in
//!   reservation `r-spNN`; the `n`-th spread request names node `n % 32`, unit `n / 32`;
//! - node `mk` (the spot market): [`MARKET_UNITS`] units, all in reservation `r-mk`, of which
//!   [`MARKET_RELEASED`] (every hundredth) are released and idle: `GET /v1/market?nodeId=mk`
//!   lists them all in one page.

use std::path::Path;

use anyhow::{Context as _, anyhow};
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::vms::NewVm;
use reservations_store::{Context, Store};

pub const OWNER_ORG: &str = "owner";
pub const TENANT_ORG: &str = "tenant";
pub const THROUGHPUT_NODE: &str = "tp";
pub const THROUGHPUT_UNITS: usize = 20_000;
pub const MARKET_NODE: &str = "mk";
pub const MARKET_UNITS: usize = 100_000;
pub const MARKET_RELEASED: usize = 1_000;
/// A node whose reservation released every unit, each running a spot VM of the tenant: what
/// a reclaim with notice takes back (one fresh unit per request).
pub const NOTICE_NODE: &str = "nt";
pub const NOTICE_UNITS: usize = 5_000;

/// Nodes that writes are spread over, each with [`SPREAD_UNITS`] units all in one
/// reservation: writes about different nodes never wait for each other.
pub const SPREAD_NODES: usize = 32;
pub const SPREAD_UNITS: usize = 2_000;

pub fn spread_node(i: usize) -> String {
    format!("sp{i:02}")
}

pub fn unit_id(i: usize) -> String {
    format!("u{i:06}")
}

pub fn scale_node(units: usize) -> String {
    format!("s{units}")
}

pub fn reservation_of(node: &str) -> String {
    format!("r-{node}")
}

/// The capacity manager of `owner`, as the native baseline acts.
pub fn owner_capacity_manager() -> Caller {
    Caller {
        key_id: "bench-native".to_owned(),
        org_id: Some(OWNER_ORG.to_owned()),
        permissions: Role::CapacityManager.permissions(),
    }
}

fn tenant_member() -> Caller {
    Caller {
        key_id: "bench-setup-tenant".to_owned(),
        org_id: Some(TENANT_ORG.to_owned()),
        permissions: Role::Member.permissions(),
    }
}

fn store_error(e: reservations_store::StoreError) -> anyhow::Error {
    anyhow!("{e}")
}

/// Writes every fixture into a new database at `path`; returns how long it took per part.
pub fn build(path: &Path, scales: &[usize]) -> anyhow::Result<Vec<(String, f64)>> {
    let _ = std::fs::remove_file(path);
    let db = NativeDb::open(path).map_err(|e| anyhow!("{e}"))?;
    let store = Store::open(&db).map_err(store_error)?;
    // Set-up only: this connection's commits skip fsync (the file is copied after a
    // checkpoint; what is measured later runs with the app's own settings).
    db.connection()
        .execute_batch("PRAGMA synchronous = OFF")
        .context("pragma")?;
    let operator = Caller::operator("bench-setup");
    let tenant = tenant_member();
    let now = chrono::Utc::now();
    let ctx = |caller| Context {
        caller,
        now,
        request_id: "bench-setup",
        client_request_id: None,
    };
    let mut timings = Vec::new();
    let started = std::time::Instant::now();
    for org in [OWNER_ORG, TENANT_ORG] {
        store
            .identity()
            .create_org(&ctx(&operator), org, org)
            .map_err(store_error)?;
    }
    let mut nodes = vec![
        (THROUGHPUT_NODE.to_owned(), THROUGHPUT_UNITS, false),
        (MARKET_NODE.to_owned(), MARKET_UNITS, false),
        (NOTICE_NODE.to_owned(), NOTICE_UNITS, false),
    ];
    nodes.extend((0..SPREAD_NODES).map(|i| (spread_node(i), SPREAD_UNITS, false)));
    nodes.extend(scales.iter().map(|&n| (scale_node(n), n, true)));
    for (node, units, with_vms) in nodes {
        let part = std::time::Instant::now();
        let unit_ids: Vec<String> = (0..units).map(unit_id).collect();
        store
            .capacity()
            .put_node(&ctx(&operator), &node, OWNER_ORG, &unit_ids)
            .map_err(store_error)?;
        store
            .capacity()
            .create_reservation(
                &ctx(&operator),
                &node,
                &reservation_of(&node),
                &NewReservation {
                    reserved_unit_ids: unit_ids.clone(),
                    allowed_org_ids: vec![TENANT_ORG.to_owned()],
                    managing_org_ids: Vec::new(),
                    term: Term {
                        starts_at: now - chrono::TimeDelta::hours(1),
                        ends_at: None,
                    },
                    contract_ref: Some("bench".to_owned()),
                    reason: None,
                },
            )
            .map_err(store_error)?;
        if with_vms {
            for (i, unit) in unit_ids.iter().enumerate().skip(1) {
                store
                    .capacity()
                    .place_vm(
                        &ctx(&tenant),
                        NewVm {
                            id: &format!("vm-{node}-{i}"),
                            node_id: &node,
                            unit_ids: std::slice::from_ref(unit),
                            tier: Tier::Community,
                        },
                    )
                    .map_err(store_error)?;
            }
        }
        if node == MARKET_NODE {
            let released: Vec<String> = unit_ids
                .iter()
                .step_by(MARKET_UNITS / MARKET_RELEASED)
                .cloned()
                .collect();
            store
                .capacity()
                .change_capacity(
                    &ctx(&operator),
                    CapacityChange {
                        action: CapacityAction::Release,
                        node_id: &node,
                        reservation_id: &reservation_of(&node),
                        unit_ids: &released,
                        reason: Some("bench"),
                        representation: Representation::Minimal,
                        notice_seconds: None,
                        until: None,
                    },
                )
                .map_err(store_error)?;
        }
        if node == NOTICE_NODE {
            for chunk in unit_ids.chunks(1_000) {
                store
                    .capacity()
                    .change_capacity(
                        &ctx(&operator),
                        CapacityChange {
                            action: CapacityAction::Release,
                            node_id: &node,
                            reservation_id: &reservation_of(&node),
                            unit_ids: chunk,
                            reason: Some("bench"),
                            representation: Representation::Minimal,
                            notice_seconds: None,
                            until: None,
                        },
                    )
                    .map_err(store_error)?;
            }
            for (i, unit) in unit_ids.iter().enumerate() {
                store
                    .capacity()
                    .place_vm(
                        &ctx(&tenant),
                        NewVm {
                            id: &format!("vm-{node}-{i}"),
                            node_id: &node,
                            unit_ids: std::slice::from_ref(unit),
                            tier: Tier::Spot,
                        },
                    )
                    .map_err(store_error)?;
            }
        }
        timings.push((
            format!("node {node}: {units} units, reservation, {} VMs", {
                if with_vms {
                    units - 1
                } else if node == NOTICE_NODE {
                    units
                } else {
                    0
                }
            }),
            part.elapsed().as_secs_f64(),
        ));
    }
    checkpoint(&db)?;
    timings.push(("total".to_owned(), started.elapsed().as_secs_f64()));
    Ok(timings)
}

/// Moves everything into the database file, so that copying the file copies the fixtures.
fn checkpoint(db: &NativeDb) -> anyhow::Result<()> {
    db.connection()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .context("checkpoint")?;
    Ok(())
}

/// Brings fixtures an earlier build made to this build's schema, as the app would.
pub fn migrate(path: &Path) -> anyhow::Result<()> {
    let db = NativeDb::open(path).map_err(|e| anyhow!("{e}"))?;
    reservations_store::schema::migrate(&db).map_err(store_error)?;
    checkpoint(&db)?;
    Ok(())
}

/// A copy of the template database as `<dir>/sqlite_db.db` (where the host looks for it).
pub fn install(template: &Path, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let target = dir.join("sqlite_db.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", target.display()));
    }
    std::fs::copy(template, &target)
        .with_context(|| format!("cannot copy the fixtures to {}", target.display()))?;
    Ok(target)
}
