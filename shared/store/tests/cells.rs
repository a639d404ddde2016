//! The market over several cells, each its own SQLite file: the same operations on one
//! database and on four cells answer the same, page by page, while writes go on between the
//! pages; a key revoked through the cells is refused by every cell's write; a node's orgs are
//! the directory's; a VM is found wherever its node is.
//!
//! Cases: `CELL_CASES` (default 32), drawn from `PROPERTY_SEED`.

use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::TimeDelta;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

use reservations_domain::Timestamp;
use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::market::parse_cursor;
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::time::from_millis;
use reservations_domain::vm::Tier;
use reservations_store::audit::AuditFilter;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::cells::{Cell, CellStores, Cells, Positions, merged, merged_trail};
use reservations_store::keys::NewApiKey;
use reservations_store::native::NativeDb;
use reservations_store::vms::{NewVm, VmFilter};
use reservations_store::{Context, Store, StoreError};

#[path = "../../domain/tests/property_seed/mod.rs"]
mod property_seed;
use property_seed::property_seed;

const ORGS: [&str; 3] = ["owner", "aud", "buyer"];

fn t0() -> Timestamp {
    from_millis(1_800_000_000_000)
}

fn at(caller: &Caller, now: Timestamp) -> Context<'_> {
    Context {
        caller,
        now,
        request_id: "req",
        client_request_id: None,
    }
}

fn buyer() -> Caller {
    Caller {
        key_id: "key-buyer".into(),
        org_id: Some("buyer".into()),
        permissions: Role::Member.permissions(),
    }
}

/// `count` database files in `dir`: cell 0's, which holds the directory, first.
struct Files {
    dbs: Vec<NativeDb>,
}

impl Files {
    fn new(dir: &std::path::Path, name: &str, count: usize) -> Files {
        let dbs = (0..count)
            .map(|cell| NativeDb::open(dir.join(format!("{name}-{cell}.db"))).unwrap())
            .collect();
        Files { dbs }
    }
}

/// Runs `test` on four cells, each a fresh file, with the directory's store.
fn on_four_cells(test: impl FnOnce(&CellStores<'_>, &Store<'_>)) {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(dir.path(), "cells", 4);
    let directory = Store::open(&files.dbs[0]).unwrap();
    let stores = cell_stores(&files, &directory);
    test(&stores, &directory);
}

/// The stores of `files` as a deployment of that many cells.
fn cell_stores<'a>(files: &'a Files, directory: &'a Store<'a>) -> CellStores<'a> {
    let cells = Cells::new(files.dbs.len()).unwrap();
    let others = files.dbs[1..]
        .iter()
        .map(|db| Store::open(db).unwrap().with_directory(directory))
        .collect();
    CellStores::new(cells, directory, others)
}

/// One write of the world, applied the same way to every layout.
#[derive(Clone, Debug)]
enum Op {
    Node { node: usize, units: usize },
    Reserve { node: usize, released: usize },
    Place { node: usize, vm: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..8usize, 1..5usize).prop_map(|(node, units)| Op::Node { node, units }),
        2 => (0..8usize, 0..4usize).prop_map(|(node, released)| Op::Reserve { node, released }),
        1 => (0..8usize, 0..1000usize).prop_map(|(node, vm)| Op::Place { node, vm }),
    ]
}

fn unit_ids(count: usize) -> Vec<String> {
    (0..count).map(|u| format!("u{u}")).collect()
}

/// Applies `op`; a refusal is part of the world (both layouts refuse alike).
fn apply(stores: &CellStores<'_>, op: &Op, step: i64) {
    let operator = Caller::operator("operator");
    let now = t0() + TimeDelta::seconds(step);
    let ctx = at(&operator, now);
    match *op {
        Op::Node { node, units } => {
            let id = format!("n{node}");
            let _ = stores
                .of_node(&id)
                .capacity()
                .put_node(&ctx, &id, "owner", &unit_ids(units));
        }
        Op::Reserve { node, released } => {
            let id = format!("n{node}");
            let store = stores.of_node(&id);
            let reservation = format!("r{step}");
            let created = store.capacity().create_reservation(
                &ctx,
                &id,
                &reservation,
                &NewReservation {
                    reserved_unit_ids: vec![format!("u{released}")],
                    allowed_org_ids: vec!["aud".into()],
                    managing_org_ids: Vec::new(),
                    term: Term {
                        starts_at: t0() - TimeDelta::hours(1),
                        ends_at: None,
                    },
                    contract_ref: None,
                    reason: None,
                },
            );
            if created.is_ok() {
                store
                    .capacity()
                    .change_capacity(
                        &ctx,
                        CapacityChange {
                            action: CapacityAction::Release,
                            node_id: &id,
                            reservation_id: &reservation,
                            unit_ids: &[format!("u{released}")],
                            reason: None,
                            representation: Representation::Minimal,
                            notice_seconds: None,
                            until: None,
                        },
                    )
                    .expect("an idle reserved unit is released");
            }
        }
        Op::Place { node, vm } => {
            let id = format!("n{node}");
            let buyer = buyer();
            let _ = stores.of_node(&id).capacity().place_vm(
                &at(&buyer, now),
                NewVm {
                    id: &format!("vm-{vm:04}-{step}"),
                    node_id: &id,
                    unit_ids: &[format!("u{}", vm % 3)],
                    tier: Tier::Spot,
                },
            );
        }
    }
}

/// What a page shows, to compare layouts.
type Shown = (Vec<String>, Option<String>);

fn nodes_page(stores: &CellStores<'_>, after: Option<&str>, limit: usize, now: Timestamp) -> Shown {
    let operator = Caller::operator("operator");
    let ctx = at(&operator, now);
    let pages = stores
        .all()
        .map(|(_, store)| store.capacity().list_nodes(&ctx, None, after, limit))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let page = merged(pages, limit);
    let ids = page.items.iter().map(|n| n.summary.id.clone()).collect();
    (ids, page.next_cursor)
}

fn market_page(
    stores: &CellStores<'_>,
    after: Option<&str>,
    limit: usize,
    now: Timestamp,
) -> Shown {
    let operator = Caller::operator("operator");
    let ctx = at(&operator, now);
    let after = after.map(|cursor| parse_cursor(cursor).unwrap());
    let pages = stores
        .all()
        .map(|(_, store)| store.market().read_market(&ctx, None, after, limit))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let page = merged(pages, limit);
    let offers = page
        .items
        .iter()
        .map(|o| format!("{}/{}", o.node_id, o.unit_id))
        .collect();
    (offers, page.next_cursor)
}

fn vms_page(stores: &CellStores<'_>, after: Option<&str>, limit: usize, now: Timestamp) -> Shown {
    let buyer = buyer();
    let filter = VmFilter {
        node_id: None,
        status: None,
        after: after.map(str::to_owned),
        limit,
    };
    let ctx = at(&buyer, now);
    let pages = stores
        .all()
        .map(|(_, store)| store.capacity().list_vms(&ctx, &filter))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let page = merged(pages, limit);
    let ids = page.items.iter().map(|vm| vm.id.clone()).collect();
    (ids, page.next_cursor)
}

/// How many walks of each listing went past a first page: the property must see them.
static WALKED_ON: [AtomicUsize; 3] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

type Lister = fn(&CellStores<'_>, Option<&str>, usize, Timestamp) -> Shown;

fn check_layouts_agree(
    world: &[Op],
    walks: &[(usize, usize, Vec<Op>)],
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let one = Files::new(dir.path(), "one", 1);
    let four = Files::new(dir.path(), "four", 4);
    let one_directory = Store::open(&one.dbs[0]).unwrap();
    let four_directory = Store::open(&four.dbs[0]).unwrap();
    let layouts = [
        cell_stores(&one, &one_directory),
        cell_stores(&four, &four_directory),
    ];
    let operator = Caller::operator("operator");
    for stores in &layouts {
        for org in ORGS {
            stores
                .directory()
                .identity()
                .create_org(&at(&operator, t0() - TimeDelta::hours(2)), org, org)
                .unwrap();
        }
    }
    let mut step = 0;
    for op in world {
        step += 1;
        for stores in &layouts {
            apply(stores, op, step);
        }
    }
    walk_the_trail(&layouts, walks, &mut step)?;
    let listers: [(&str, Lister); 3] = [
        ("nodes", nodes_page),
        ("market", market_page),
        ("VMs", vms_page),
    ];
    for (which, limit, writes_between) in walks {
        let (name, list) = listers[*which];
        let mut cursor: Option<String> = None;
        let mut seen: Vec<String> = Vec::new();
        let mut writes = writes_between.iter();
        for _ in 0..200 {
            let now = t0() + TimeDelta::seconds(step);
            let [one_page, four_page] = [&layouts[0], &layouts[1]]
                .map(|stores| list(stores, cursor.as_deref(), *limit, now));
            prop_assert_eq!(&one_page, &four_page, "a page of the {} listing", name);
            seen.extend(four_page.0.iter().cloned());
            let Some(next) = four_page.1 else { break };
            WALKED_ON[*which].fetch_add(1, Ordering::Relaxed);
            cursor = Some(next);
            if let Some(op) = writes.next() {
                step += 1;
                for stores in &layouts {
                    apply(stores, op, step);
                }
            }
        }
        let mut once = seen.clone();
        once.sort();
        once.dedup();
        prop_assert_eq!(once.len(), seen.len(), "nothing listed twice in {}", name);
    }
    Ok(())
}

/// Walks the operator's audit trail across the cells, a page at a time, with writes between
/// pages (made on both layouts): every event there was before the walk is listed once,
/// each cell's in its order.
fn walk_the_trail(
    layouts: &[CellStores<'_>; 2],
    walks: &[(usize, usize, Vec<Op>)],
    step: &mut i64,
) -> Result<(), TestCaseError> {
    let stores = &layouts[1];
    let operator = Caller::operator("operator");
    let every_event = |stores: &CellStores<'_>| {
        let mut all = Vec::new();
        for cell in stores.cells().all() {
            let page = stores
                .store(cell)
                .trail()
                .list_audit(&AuditFilter {
                    limit: 1000,
                    ..AuditFilter::default()
                })
                .unwrap();
            all.extend(page.items.iter().map(|row| (cell, row.seq())));
        }
        all
    };
    let before = every_event(stores);
    let limit = walks.first().map_or(3, |(_, limit, _)| *limit);
    let mut writes = walks.iter().flat_map(|(_, _, ops)| ops.iter());
    let mut after = Positions::start(stores.cells());
    let mut listed: Vec<(Cell, i64)> = Vec::new();
    for _ in 0..1000 {
        let pages = stores
            .all()
            .map(|(cell, store)| {
                let filter = AuditFilter {
                    after_seq: Some(after.get(cell)),
                    limit,
                    ..AuditFilter::default()
                };
                (cell, store.trail().read_audit(&operator, filter).unwrap())
            })
            .collect();
        let page = merged_trail(pages, &after, limit);
        prop_assert!(page.rows.len() <= limit);
        for (cell, row) in &page.rows {
            prop_assert!(after.get(*cell) < row.seq() && row.seq() <= page.next.get(*cell));
            listed.push((*cell, row.seq()));
        }
        after = page.next;
        if !page.more {
            break;
        }
        if let Some(op) = writes.next() {
            *step += 1;
            for layout in layouts {
                apply(layout, op, *step);
            }
        }
    }
    for cell in stores.cells().all() {
        let seqs: Vec<i64> = listed
            .iter()
            .filter(|(c, _)| *c == cell)
            .map(|(_, seq)| *seq)
            .collect();
        prop_assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "cell {:?} listed in order once: {:?}",
            cell,
            seqs
        );
    }
    for event in before {
        prop_assert!(listed.contains(&event), "{:?} was listed", event);
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("CELL_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(32)
}

#[test]
fn four_cells_list_what_one_database_lists_page_by_page_while_writes_go_on() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        source_file: Some(file!()),
        rng_seed: RngSeed::Fixed(property_seed()),
        ..Config::default()
    });
    let walk = (0..3usize, 1..5usize, proptest::collection::vec(op(), 0..6));
    runner
        .run(
            &(
                proptest::collection::vec(op(), 1..60),
                proptest::collection::vec(walk, 1..4),
            ),
            |(world, walks)| check_layouts_agree(&world, &walks),
        )
        .unwrap();
    for (name, walked_on) in ["nodes", "market", "VMs"].iter().zip(&WALKED_ON) {
        let pages = walked_on.load(Ordering::Relaxed);
        assert!(
            pages >= 4,
            "only {pages} pages of the {name} listing followed a cursor"
        );
    }
}

#[test]
fn a_key_revoked_through_the_cells_is_refused_by_every_cells_write() {
    on_four_cells(|stores, directory| {
        let operator = Caller::operator("operator");
        let ctx = at(&operator, t0());
        for org in ORGS {
            directory.identity().create_org(&ctx, org, org).unwrap();
        }
        // A node in every cell.
        let mut nodes = Vec::new();
        for n in 0.. {
            let id = format!("n{n}");
            let cell = stores.cells().home_of(&id);
            if nodes.iter().all(|(_, c)| *c != cell) {
                stores
                    .of_node(&id)
                    .capacity()
                    .put_node(&ctx, &id, "owner", &unit_ids(2))
                    .expect("the owner org is the directory's");
                nodes.push((id, cell));
            }
            if nodes.len() == 4 {
                break;
            }
        }
        let key = directory
            .identity()
            .create_key(
                &ctx,
                NewApiKey {
                    id: "key-ops",
                    org_id: "owner",
                    name: "ops",
                    role: Role::CapacityManager,
                    permissions: None,
                    secret_hash: "hash",
                },
            )
            .expect("a key");
        let owner = Caller {
            key_id: key.id.clone(),
            org_id: Some("owner".into()),
            permissions: Role::CapacityManager.permissions(),
        };
        stores.revoke_key(&ctx, "owner", &key.id).expect("revoked");
        for (id, cell) in &nodes {
            let refused = stores.of_node(id).capacity().put_node(
                &at(&owner, t0() + TimeDelta::seconds(1)),
                id,
                "owner",
                &unit_ids(3),
            );
            assert!(
                matches!(refused, Err(StoreError::KeyRevoked)),
                "{cell:?}: {refused:?}"
            );
        }
    });
}

#[test]
fn a_node_naming_an_unknown_org_is_refused_in_any_cell() {
    on_four_cells(|stores, directory| {
        let operator = Caller::operator("operator");
        let ctx = at(&operator, t0());
        directory
            .identity()
            .create_org(&ctx, "owner", "Owner")
            .unwrap();
        for n in 0..8 {
            let id = format!("n{n}");
            let store = stores.of_node(&id);
            assert!(
                store
                    .capacity()
                    .put_node(&ctx, &id, "nobody", &unit_ids(1))
                    .is_err()
            );
            store
                .capacity()
                .put_node(&ctx, &id, "owner", &unit_ids(1))
                .unwrap();
        }
    });
}

#[test]
fn a_vm_is_looked_for_in_every_cell_named_first_and_found_in_its_node_s() {
    on_four_cells(|stores, directory| {
        let operator = Caller::operator("operator");
        let ctx = at(&operator, t0());
        for org in ORGS {
            directory.identity().create_org(&ctx, org, org).unwrap();
        }
        let node = "n1";
        stores
            .of_node(node)
            .capacity()
            .put_node(&ctx, node, "owner", &unit_ids(2))
            .unwrap();
        // An id its cell would not name: as a VM of a node moved to another cell.
        let node_cell = stores.cells().home_of(node);
        let vm_id = (0..)
            .map(|n| format!("vm-{n}"))
            .find(|id| stores.cells().home_of(id) != node_cell)
            .unwrap();
        let buyer = buyer();
        stores
            .of_node(node)
            .capacity()
            .place_vm(
                &at(&buyer, t0()),
                NewVm {
                    id: &vm_id,
                    node_id: node,
                    unit_ids: &unit_ids(1),
                    tier: Tier::Spot,
                },
            )
            .unwrap();
        let ctx = at(&buyer, t0());
        let read_in = |cell, id: &str| stores.store(cell).capacity().read_vm(&ctx, id);
        let looked_in: Vec<Cell> = stores.cells_for_vm(&vm_id).collect();
        assert_eq!(looked_in.len(), 4, "every cell is looked in");
        assert_eq!(
            looked_in[0],
            stores.cells().home_of(&vm_id),
            "the named cell first"
        );
        let found: Vec<(Cell, String)> = looked_in
            .iter()
            .filter_map(|cell| read_in(*cell, &vm_id).ok().map(|vm| (*cell, vm.node_id)))
            .collect();
        assert_eq!(found, vec![(node_cell, node.to_owned())]);
        for cell in stores.cells_for_vm("vm-none") {
            assert!(matches!(
                read_in(cell, "vm-none"),
                Err(StoreError::Domain(_))
            ));
        }
    });
}
