//! Where each kind of write's pages go: the pages one write changes, by table and index, as
//! SQLite's write-ahead log records them. Those pages are what a libSQL primary appends to
//! its replication log and ships to every replica (one frame each), and what a local file
//! syncs, so they are the write's cost below the statement.
//!
//! Every write goes through the store natively over rusqlite (the components' exact SQL) on
//! a file in WAL mode that is never checkpointed during the run; each write's new WAL frames
//! are read back and each frame's page is named with `dbstat`. A one-row insert into a
//! table of its own is measured the same way, as the floor. `WRITE_PAGES_WRITES` (default 100)
//! writes of each kind; the counts are averages, and show which b-trees each write touches.
//!
//! `cargo run --release -p gpu-bench --bin write-pages`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::time::from_millis;
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::keys::NewApiKey;
use reservations_store::native::NativeDb;
use reservations_store::vms::NewVm;
use reservations_store::{Context, Store, StoreError};

const PAGE_SIZE: u64 = 4096;
const FRAME_HEADER: u64 = 24;
const WAL_HEADER: u64 = 32;
/// Units of the node whose reservation is released and reclaimed.
const UNITS: usize = 512;
/// VMs placed and ended on the node of 8 units before its writes are measured.
const CHURN: usize = 400;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fail(e: StoreError) -> anyhow::Error {
    anyhow!("{e}")
}

/// The WAL of a database file, read from where the last look left it.
struct WalReader {
    path: PathBuf,
    read_to: u64,
}

impl WalReader {
    fn new(db: &Path) -> WalReader {
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        let path = PathBuf::from(path);
        let read_to = std::fs::metadata(&path).map_or(0, |m| m.len());
        WalReader { path, read_to }
    }

    /// The pages of the frames appended since the last look.
    fn new_pages(&mut self) -> anyhow::Result<Vec<u32>> {
        let bytes = std::fs::read(&self.path)?;
        let mut at = self.read_to.max(WAL_HEADER);
        let mut pages = Vec::new();
        while at + FRAME_HEADER + PAGE_SIZE <= bytes.len() as u64 {
            let header = &bytes[at as usize..at as usize + 4];
            pages.push(u32::from_be_bytes(header.try_into()?));
            at += FRAME_HEADER + PAGE_SIZE;
        }
        self.read_to = at;
        Ok(pages)
    }
}

/// Frames per write and which b-tree each frame's page belongs to, summed over the writes.
#[derive(Default)]
struct Tally {
    writes: usize,
    frames: usize,
    by_btree: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, db: &NativeDb, pages: &[u32]) -> anyhow::Result<()> {
        self.writes += 1;
        self.frames += pages.len();
        for &page in pages {
            let name: String = db
                .connection()
                .query_row("SELECT name FROM dbstat WHERE pageno = ?1", [page], |row| {
                    row.get(0)
                })
                .unwrap_or_else(|_| match page {
                    1 => "(the database header)".to_owned(),
                    _ => "(free or overflow)".to_owned(),
                });
            *self.by_btree.entry(name).or_default() += 1;
        }
        Ok(())
    }

    fn per_write(&self, count: usize) -> f64 {
        count as f64 / self.writes.max(1) as f64
    }
}

struct World {
    db: NativeDb,
    path: PathBuf,
}

impl World {
    fn store(&self) -> anyhow::Result<Store<'_>> {
        Store::open(&self.db).map_err(fail)
    }

    /// Runs `write` `count` times (with its index), tallying each one's pages.
    fn measure(
        &self,
        count: usize,
        write: impl FnMut(&Store<'_>, usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<Tally> {
        self.measure_after(count, |_, _| Ok(()), write)
    }

    /// As [`World::measure`], each write after `prepare` with the same index, whose pages
    /// are not counted.
    fn measure_after(
        &self,
        count: usize,
        mut prepare: impl FnMut(&Store<'_>, usize) -> anyhow::Result<()>,
        mut write: impl FnMut(&Store<'_>, usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<Tally> {
        let store = self.store()?;
        let mut wal = WalReader::new(&self.path);
        let mut tally = Tally::default();
        for i in 0..count {
            prepare(&store, i)?;
            wal.new_pages()?;
            write(&store, i)?;
            let pages = wal.new_pages()?;
            tally.add(&self.db, &pages)?;
        }
        Ok(tally)
    }
}

fn main() -> anyhow::Result<()> {
    let writes = knob("WRITE_PAGES_WRITES", 100);
    let dir = std::env::temp_dir().join(format!("write-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rows = measure_every_kind(&dir.join("db.sqlite"), writes)?;
    let floor = rows[0].1.per_write(rows[0].1.frames);
    println!("pages (WAL frames) per write, {writes} writes of each kind");
    println!("{:<40} {:>7} {:>9}", "write", "frames", "× floor");
    for (name, tally) in &rows {
        let frames = tally.per_write(tally.frames);
        println!("{name:<40} {frames:>7.2} {:>9.1}", frames / floor);
    }
    for (name, tally) in &rows {
        println!("\n{name}: pages per write by table and index");
        let mut by_btree: Vec<_> = tally.by_btree.iter().collect();
        by_btree.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (btree, count) in by_btree {
            println!("  {:<40} {:>6.2}", btree, tally.per_write(*count));
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `writes` writes of each kind on a new database at `path`, each kind's pages tallied, the
/// floor (a one-row insert into a table of its own) first.
fn measure_every_kind(path: &Path, writes: usize) -> anyhow::Result<Vec<(&'static str, Tally)>> {
    let path = path.to_owned();
    let db = NativeDb::open(&path).map_err(|e| anyhow!("{e}"))?;
    Store::open(&db).map_err(fail)?;
    db.connection()
        .execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE floor (x INTEGER)")?;
    let world = World { db, path };

    let operator = Caller::operator("bench");
    let ctx = Context::new(&operator, from_millis(1_800_000_000_000), "bench");
    let owner = Caller {
        key_id: "key-owner".into(),
        org_id: Some("owner".into()),
        permissions: Role::Admin.permissions(),
    };
    let owner_ctx = Context::new(&owner, ctx.now, "bench");
    let buyer = Caller {
        key_id: "key-buyer".into(),
        org_id: Some("buyer".into()),
        permissions: Role::Member.permissions(),
    };
    let buyer_ctx = Context::new(&buyer, ctx.now, "bench");
    let store = world.store()?;
    for org in ["owner", "research", "buyer"] {
        store.identity().create_org(&ctx, org, org).map_err(fail)?;
    }
    for (id, org, role) in [
        ("key-owner", "owner", Role::Admin),
        ("key-buyer", "buyer", Role::Member),
    ] {
        store
            .identity()
            .create_key(
                &ctx,
                NewApiKey {
                    id,
                    org_id: org,
                    name: id,
                    role,
                    permissions: None,
                    secret_hash: "hash",
                },
            )
            .map_err(fail)?;
    }
    let units: Vec<String> = (0..UNITS).map(|i| format!("gpu-{i:04}")).collect();
    store
        .capacity()
        .put_node(&ctx, "n1", "owner", &units)
        .map_err(fail)?;
    let reservation = |units: Vec<String>| NewReservation {
        reserved_unit_ids: units,
        allowed_org_ids: vec!["research".into()],
        managing_org_ids: Vec::new(),
        term: Term {
            starts_at: from_millis(0),
            ends_at: None,
        },
        contract_ref: None,
        reason: Some("bench".into()),
    };
    store
        .capacity()
        .create_reservation(&ctx, "n1", "r1", &reservation(units.clone()))
        .map_err(fail)?;
    let free: Vec<String> = (0..UNITS).map(|i| format!("free-{i:04}")).collect();
    store
        .capacity()
        .put_node(&ctx, "n2", "owner", &free)
        .map_err(fail)?;

    // The owner's capacity changes, and the buyer's spot VMs, on any node.
    let change_capacity = |store: &Store<'_>,
                           action,
                           (node_id, reservation_id): (&str, &str),
                           unit_ids: &[String],
                           until: Option<Timestamp>| {
        store
            .capacity()
            .change_capacity(
                &owner_ctx,
                CapacityChange {
                    action,
                    node_id,
                    reservation_id,
                    unit_ids,
                    reason: Some("bench"),
                    representation: Representation::Minimal,
                    notice_seconds: None,
                    until,
                },
            )
            .map(|_| ())
            .map_err(fail)
    };
    let place_spot = |store: &Store<'_>, node_id: &str, id: &str, unit: &str| {
        store
            .capacity()
            .place_vm(
                &buyer_ctx,
                NewVm {
                    id,
                    node_id,
                    unit_ids: &[unit.to_owned()],
                    tier: Tier::Spot,
                },
            )
            .map(|_| ())
            .map_err(fail)
    };
    let terminate = |store: &Store<'_>, id: &str| {
        store
            .capacity()
            .terminate_vm(&buyer_ctx, id)
            .map(|_| ())
            .map_err(fail)
    };
    let r1 = ("n1", "r1");
    let unit = |i: usize| units[i % UNITS].clone();
    let mut rows: Vec<(&'static str, Tally)> = Vec::new();
    rows.push((
        "one-row INSERT (the floor)",
        world.measure(writes, |store, i| {
            let _ = store;
            world
                .db
                .connection()
                .execute("INSERT INTO floor (x) VALUES (?1)", [i as i64])?;
            Ok(())
        })?,
    ));
    rows.push((
        "release of one unit",
        world.measure(writes, |store, i| {
            change_capacity(store, CapacityAction::Release, r1, &[unit(i)], None)
        })?,
    ));
    rows.push((
        "VM placement (spot, one released unit)",
        world.measure(writes, |store, i| {
            place_spot(store, "n1", &format!("vm-{i:05}"), &unit(i))
        })?,
    ));
    rows.push((
        "VM termination",
        world.measure(writes, |store, i| terminate(store, &format!("vm-{i:05}")))?,
    ));
    // A node of 8 units whose VMs come and go, as a busy node's do: its units released, and
    // `CHURN` spot VMs placed and ended on them before anything is measured. VM `c-{t}` runs
    // on unit `t % 8`.
    let small: Vec<String> = (0..8).map(|u| format!("s-{u}")).collect();
    store
        .capacity()
        .put_node(&ctx, "n3", "owner", &small)
        .map_err(fail)?;
    store
        .capacity()
        .create_reservation(&ctx, "n3", "r3", &reservation(small.clone()))
        .map_err(fail)?;
    change_capacity(&store, CapacityAction::Release, ("n3", "r3"), &small, None)?;
    let place_on_small = |store: &Store<'_>, turn: usize| {
        place_spot(store, "n3", &format!("c-{turn:05}"), &small[turn % 8])
    };
    let end_on_small = |store: &Store<'_>, turn: usize| terminate(store, &format!("c-{turn:05}"));
    for turn in 0..CHURN {
        place_on_small(&store, turn)?;
        end_on_small(&store, turn)?;
    }
    rows.push((
        "VM placement, busy node (8 units)",
        world.measure_after(
            writes,
            |store, i| match i.checked_sub(8) {
                Some(earlier) => end_on_small(store, CHURN + earlier),
                None => Ok(()),
            },
            |store, i| place_on_small(store, CHURN + i),
        )?,
    ));
    for turn in CHURN + writes.saturating_sub(8)..CHURN + writes {
        end_on_small(&store, turn)?;
    }
    let next = CHURN + writes;
    rows.push((
        "VM termination, busy node (8 units)",
        world.measure_after(
            writes,
            |store, i| place_on_small(store, next + i),
            |store, i| end_on_small(store, next + i),
        )?,
    ));
    rows.push((
        "reclaim of one unit",
        world.measure(writes, |store, i| {
            change_capacity(store, CapacityAction::Reclaim, r1, &[unit(i)], None)
        })?,
    ));
    let an_hour_on = ctx.now + chrono::TimeDelta::hours(1);
    rows.push((
        "release of one unit until a time",
        world.measure(writes, |store, i| {
            change_capacity(
                store,
                CapacityAction::Release,
                r1,
                &[unit(i)],
                Some(an_hour_on),
            )
        })?,
    ));
    rows.push((
        "reservation create (one unit)",
        world.measure(writes, |store, i| {
            store
                .capacity()
                .create_reservation(
                    &owner_ctx,
                    "n2",
                    &format!("rc-{i:05}"),
                    &reservation(vec![free[i % UNITS].clone()]),
                )
                .map(|_| ())
                .map_err(fail)
        })?,
    ));
    rows.push((
        "reservation cancel",
        world.measure(writes, |store, i| {
            store
                .capacity()
                .cancel_reservation(&owner_ctx, "n2", &format!("rc-{i:05}"), None)
                .map(|_| ())
                .map_err(fail)
        })?,
    ));
    rows.push((
        "node registration (8 units)",
        world.measure(writes, |store, i| {
            let units: Vec<String> = (0..8).map(|u| format!("gpu-{u}")).collect();
            store
                .capacity()
                .put_node(&ctx, &format!("new-{i:05}"), "owner", &units)
                .map(|_| ())
                .map_err(fail)
        })?,
    ));
    rows.push((
        "org creation",
        world.measure(writes, |store, i| {
            store
                .identity()
                .create_org(&ctx, &format!("org-{i:05}"), "Another")
                .map(|_| ())
                .map_err(fail)
        })?,
    ));

    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables and indexes each kind of write changes pages of, besides the trail's own
    /// (`audit_events`, `audit_by_place`, `audit_visibility`) and the facts' versions, which
    /// every write changes. An index that comes back, or a write that touches a table it
    /// has no business in, changes these sets.
    const VM_PLACED: &[&str] = &[
        "one_running_vm_per_unit",
        "sqlite_autoindex_vms_1",
        "vm_units",
        "vm_units_by_unit",
        "vms",
        "vms_by_org_and_id",
    ];
    const VM_ENDED: &[&str] = &["one_running_vm_per_unit", "vm_units", "vms"];

    const CHANGED: &[(&str, &[&str])] = &[
        ("one-row INSERT (the floor)", &["floor"]),
        (
            "release of one unit",
            &["reservation_units", "reservation_units_on_market"],
        ),
        ("VM placement (spot, one released unit)", VM_PLACED),
        ("VM termination", VM_ENDED),
        ("VM placement, busy node (8 units)", VM_PLACED),
        ("VM termination, busy node (8 units)", VM_ENDED),
        (
            "reclaim of one unit",
            &["reservation_units", "reservation_units_on_market"],
        ),
        (
            "release of one unit until a time",
            &[
                "reservation_units",
                "reservation_units_market_ends",
                "reservation_units_on_market",
            ],
        ),
        (
            "reservation create (one unit)",
            &[
                "reservation_units",
                "reservation_units_by_position",
                "reservation_units_by_unit",
                "reservations",
                "reservations_by_node",
                "sqlite_autoindex_reservations_1",
            ],
        ),
        ("reservation cancel", &["reservations"]),
        (
            "node registration (8 units)",
            &[
                "node_units",
                "nodes",
                "nodes_by_owner",
                "sqlite_autoindex_nodes_1",
            ],
        ),
        ("org creation", &["orgs", "sqlite_autoindex_orgs_1"]),
    ];

    /// What every write changes (its event, who sees it, its place in the trail, the versions
    /// of the facts it moved), and what is not a table's: the database's first page (its
    /// change counter, under `sqlite_schema`) and pages freed or spilled by a split.
    const EVERY_WRITE: &[&str] = &[
        "audit_events",
        "audit_by_place",
        "audit_visibility",
        "fact_versions",
    ];
    const INCIDENTAL: &[&str] = &[
        "sqlite_schema",
        "(free or overflow)",
        "(the database header)",
    ];

    #[test]
    fn each_kind_of_write_changes_pages_of_its_own_tables_and_indexes_only() {
        let dir = api_support::TempDir::new("write-pages");
        let rows = measure_every_kind(&dir.path().join("db.sqlite"), 20).unwrap();
        let measured: Vec<&str> = rows.iter().map(|(name, _)| *name).collect();
        let expected: Vec<&str> = CHANGED.iter().map(|(name, _)| *name).collect();
        assert_eq!(measured, expected, "the kinds of write measured");
        let mut wrong = Vec::new();
        for ((name, tally), (_, own)) in rows.iter().zip(CHANGED) {
            let mut changed: Vec<&str> = tally
                .by_btree
                .keys()
                .map(String::as_str)
                .filter(|btree| !INCIDENTAL.contains(btree))
                .collect();
            let mut expected: Vec<&str> = own.to_vec();
            if *name != "one-row INSERT (the floor)" {
                expected.extend(EVERY_WRITE);
            }
            changed.sort_unstable();
            expected.sort_unstable();
            if changed != expected {
                wrong.push(format!(
                    "{name}: changed {changed:?}, expected {expected:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
