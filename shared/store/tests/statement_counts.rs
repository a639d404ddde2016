//! What each request costs the database, in statements: over libSQL every statement is a
//! round trip to the server. A mutation is one read outside any transaction and one write
//! statement (docs/design.md, "The write path"), so no request ever holds the write lock
//! across a round trip: no statement of any request runs under `BEGIN IMMEDIATE`. Counts are
//! deterministic, so the test asserts them exactly.
//!
//! A request is counted as the component runs it with `Prefer: return=minimal`: the API
//! key's lookup, then the operation. Opening the store costs no statement on the hot path
//! (the schema check is not made per request).
//!
//! Writes run on the primary itself (local files, a lone libSQL server: the home of writes,
//! docs/design.md "Writes at home"). An edge site's replica (here the same file, answering
//! the probe of `site::probe_forwarding` as sqld's replica does) serves reads at the same
//! counts and refuses every write before its write statement. What the probe found is
//! remembered in the key-value store.

mod acting;

use std::cell::RefCell;

use acting::{ctx, open_ended_reservation, org_key};

use reservations_domain::access::{Caller, Role};
use reservations_domain::capacity::CapacityAction;
use reservations_domain::time::from_millis;
use reservations_domain::vm::Tier;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::idempotency::{KeyedRequest, Lookup, StoredResponse};
use reservations_store::keys::NewApiKey;
use reservations_store::native::{NativeDb, NativeKv};
use reservations_store::vms::NewVm;
use reservations_store::write::{WriteAttempts, Written};
use reservations_store::{Context, KeyValue, Sql, SqlRows, SqlValue, StorageError, Store, site};

/// Statements one request ran, and how many of them while it held the write lock
/// (`BEGIN IMMEDIATE` through `COMMIT` or `ROLLBACK`, both included).
#[derive(Debug, Default, Clone, PartialEq)]
struct Cost {
    statements: Vec<String>,
    under_write_lock: usize,
}

/// Where the app's database is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Placement {
    /// The primary itself: local files, or a lone libSQL server.
    Primary,
    /// An edge site's read replica, which forwards every write statement to the primary.
    Replica,
}

/// An `Sql` that logs every statement it runs.
struct Counting {
    db: NativeDb,
    placement: Placement,
    cost: RefCell<Cost>,
    locked: RefCell<bool>,
}

impl Counting {
    fn take(&self) -> Cost {
        std::mem::take(&mut *self.cost.borrow_mut())
    }
}

impl Sql for Counting {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        let words: Vec<String> = statement
            .split_whitespace()
            .take(2)
            .map(str::to_ascii_uppercase)
            .collect();
        if words.first().map(String::as_str) == Some("BEGIN")
            && words.get(1).map(String::as_str) == Some("IMMEDIATE")
        {
            *self.locked.borrow_mut() = true;
        }
        {
            let mut cost = self.cost.borrow_mut();
            cost.statements.push(statement.to_owned());
            if *self.locked.borrow() {
                cost.under_write_lock += 1;
            }
        }
        if matches!(
            words.first().map(String::as_str),
            Some("COMMIT" | "ROLLBACK" | "END")
        ) {
            *self.locked.borrow_mut() = false;
        }
        let probe = statement.contains("site_probe_no_such_table");
        match self.db.execute(statement, params) {
            Err(e) if probe && self.placement == Placement::Replica => {
                Err(StorageError::from_sqlite_message(format!(
                    "the statement failed on the primary: {e}"
                )))
            }
            other => other,
        }
    }
}

const RESERVATION_UNITS: usize = 1_000;
const NODE: &str = "n1";
const RESERVATION: &str = "r1";
const KEY_ID: &str = "key-owner";

fn unit(i: usize) -> String {
    format!("gpu-{i:04}")
}

struct World {
    db: Counting,
    memory: NativeKv,
}

impl World {
    /// An owner org with a capacity-manager key, a node of 1 000 units all reserved for a
    /// research org by one reservation, and a spot buyer's VM on one released unit.
    fn new(dir: &std::path::Path, placement: Placement) -> World {
        // The world is made at the home, on the primary; then looked at from `placement`.
        let db = Counting {
            db: NativeDb::open(dir.join("db.sqlite")).unwrap(),
            placement: Placement::Primary,
            cost: RefCell::default(),
            locked: RefCell::new(false),
        };
        // The schema is migrated by an app connected to the primary.
        Store::open(&db.db).unwrap();
        let memory = NativeKv::open(dir.join("kv.sqlite")).unwrap();
        let world = World { db, memory };
        let store = world.store();
        let operator = Caller::operator("operator");
        let operator_ctx = ctx(&operator);
        for org in ["owner", "research", "buyer"] {
            store
                .identity()
                .create_org(&operator_ctx, org, org)
                .unwrap();
        }
        store
            .identity()
            .create_key(
                &operator_ctx,
                NewApiKey {
                    id: KEY_ID,
                    org_id: "owner",
                    name: "owner ops",
                    role: Role::CapacityManager,
                    permissions: None,
                    secret_hash: "hash",
                },
            )
            .unwrap();
        let units: Vec<String> = (0..RESERVATION_UNITS).map(unit).collect();
        store
            .capacity()
            .put_node(&operator_ctx, NODE, "owner", &units)
            .unwrap();
        store
            .capacity()
            .create_reservation(
                &operator_ctx,
                NODE,
                RESERVATION,
                &open_ended_reservation(units, vec!["research".into()]),
            )
            .unwrap();
        store
            .capacity()
            .change_capacity(
                &operator_ctx,
                world.request(CapacityAction::Release, &[unit(0)]),
            )
            .unwrap();
        let buyer = org_key("buyer", Role::Member);
        store
            .capacity()
            .place_vm(
                &ctx(&buyer),
                NewVm {
                    id: "vm-spot",
                    node_id: NODE,
                    unit_ids: &[unit(0)],
                    tier: Tier::Spot,
                },
            )
            .unwrap();
        world.db.take();
        let mut world = world;
        world.db.placement = placement;
        if placement == Placement::Replica {
            // What the home found of its database is not the replica's.
            world.memory.delete(site::SITE_MEMORY_KEY).unwrap();
        }
        world
    }

    fn request<'a>(&self, action: CapacityAction, unit_ids: &'a [String]) -> CapacityChange<'a> {
        CapacityChange {
            action,
            node_id: NODE,
            reservation_id: RESERVATION,
            unit_ids,
            reason: Some("bench"),
            representation: Representation::Minimal,
            notice_seconds: None,
            until: None,
        }
    }

    /// The store a request opens, remembering its site in the app's key-value store.
    fn store(&self) -> Store<'_> {
        Store::open(&self.db)
            .unwrap()
            .remembering_its_site(&self.memory, "default")
    }

    /// What one request costs: opening the store, the key lookup, then `operation`.
    fn cost_of(&self, operation: impl FnOnce(&Store<'_>, &Context<'_>)) -> Cost {
        let store = self.store();
        self.db.take();
        let (key, _) = store
            .identity()
            .key_with_secret_hash(KEY_ID)
            .unwrap()
            .unwrap();
        let caller = Caller {
            key_id: key.id.clone(),
            org_id: Some(key.org_id.clone()),
            permissions: key.effective_permissions(),
        };
        operation(&store, &ctx(&caller));
        self.db.take()
    }
}

/// A store call made as a request makes it.
type Operation<'a> = dyn Fn(&Store<'_>, &Context<'_>) + 'a;

/// A request ran exactly `statements` statements, none of them under the write lock.
fn check(name: &str, cost: &Cost, statements: usize) {
    eprintln!(
        "{name}: {} statements, {} under the write lock\n  {}",
        cost.statements.len(),
        cost.under_write_lock,
        cost.statements.join("\n  ")
    );
    assert_eq!(
        cost.statements.len(),
        statements,
        "{name}: {:#?}",
        cost.statements
    );
    assert_eq!(
        cost.under_write_lock, 0,
        "{name} held the write lock across statements: {:#?}",
        cost.statements
    );
}

/// What each kind of request costs on the primary: a write its one statement, a refusal none.
struct Expected {
    write: usize,
    refused: usize,
}

const ON_THE_PRIMARY: Expected = Expected {
    write: 1,
    refused: 0,
};

#[test]
fn every_request_is_one_read_and_at_most_one_write() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::new(dir.path(), Placement::Primary);
    let Expected { write, refused } = ON_THE_PRIMARY;
    let one = [unit(1)];
    let spot_unit = [unit(0)];

    let release = world.cost_of(|store, ctx| {
        store
            .capacity()
            .change_capacity(ctx, world.request(CapacityAction::Release, &one))
            .unwrap();
    });
    check("release", &release, 2 + write);

    let dry_run = world.cost_of(|store, ctx| {
        let outcome = store
            .capacity()
            .change_capacity(
                ctx,
                world.request(CapacityAction::ReclaimDryRun, &spot_unit),
            )
            .unwrap();
        assert_eq!(outcome.plan.terminate, ["vm-spot"]);
    });
    check("dry run", &dry_run, 2);

    // A reclaim that terminates a spot VM: the VM, its units and the reservation are all
    // written by the one write statement.
    let reclaim = world.cost_of(|store, ctx| {
        let outcome = store
            .capacity()
            .change_capacity(ctx, world.request(CapacityAction::Reclaim, &spot_unit))
            .unwrap();
        assert_eq!(outcome.plan.terminate, ["vm-spot"]);
    });
    check("reclaim", &reclaim, 2 + write);

    let get = world.cost_of(|store, ctx| {
        let reservation = store
            .capacity()
            .read_reservation(ctx, NODE, RESERVATION)
            .unwrap();
        assert_eq!(reservation.reserved_unit_ids.len(), RESERVATION_UNITS);
        assert_eq!(reservation.released_unit_ids, [unit(1)]);
    });
    check("GET reservation", &get, 2);

    // A refused request writes nothing.
    let refused_release = world.cost_of(|store, ctx| {
        let stranger = [unit(0), "gpu-none".to_owned()];
        store
            .capacity()
            .change_capacity(ctx, world.request(CapacityAction::Release, &stranger))
            .unwrap_err();
    });
    check("refused release", &refused_release, 2 + refused);

    let buyer = Caller {
        key_id: "key-buyer".into(),
        org_id: Some("buyer".into()),
        permissions: Role::Member.permissions(),
    };
    let operator = Caller::operator("operator");
    let cost = |caller: &Caller, operation: &Operation<'_>| {
        let store = world.store();
        world.db.take();
        operation(&store, &ctx(caller));
        world.db.take()
    };
    let place = cost(&buyer, &|store, ctx| {
        store
            .capacity()
            .place_vm(
                ctx,
                NewVm {
                    id: "vm-2",
                    node_id: NODE,
                    unit_ids: &one,
                    tier: Tier::Spot,
                },
            )
            .unwrap();
    });
    check("placement (after the key)", &place, 1 + write);
    let refused_place = cost(&buyer, &|store, ctx| {
        store
            .capacity()
            .place_vm(
                ctx,
                NewVm {
                    id: "vm-3",
                    node_id: NODE,
                    unit_ids: &one,
                    tier: Tier::Spot,
                },
            )
            .unwrap_err();
    });
    check(
        "refused placement (after the key)",
        &refused_place,
        1 + refused,
    );
    let terminate = cost(&buyer, &|store, ctx| {
        store.capacity().terminate_vm(ctx, "vm-2").unwrap();
    });
    check("termination (after the key)", &terminate, 1 + write);
    let writes: [(&str, &Operation<'_>); 6] = [
        ("org creation", &|store, ctx| {
            store
                .identity()
                .create_org(ctx, "another", "Another")
                .unwrap();
        }),
        ("node update", &|store, ctx| {
            let units: Vec<String> = (0..RESERVATION_UNITS + 1).map(unit).collect();
            store
                .capacity()
                .put_node(ctx, NODE, "owner", &units)
                .unwrap();
        }),
        ("reservation creation", &|store, ctx| {
            store
                .capacity()
                .create_reservation(
                    ctx,
                    NODE,
                    "r2",
                    &open_ended_reservation(vec![unit(RESERVATION_UNITS)], vec!["research".into()]),
                )
                .unwrap();
        }),
        ("cancellation", &|store, ctx| {
            store
                .capacity()
                .cancel_reservation(ctx, NODE, "r2", None)
                .unwrap();
        }),
        ("key creation", &|store, ctx| {
            store
                .identity()
                .create_key(
                    ctx,
                    NewApiKey {
                        id: "key-2",
                        org_id: "owner",
                        name: "second",
                        role: Role::Member,
                        permissions: None,
                        secret_hash: "hash",
                    },
                )
                .unwrap();
        }),
        ("key revocation", &|store, ctx| {
            store.identity().revoke_key(ctx, "owner", "key-2").unwrap();
        }),
    ];
    for (name, operation) in writes {
        check(
            &format!("{name} (after the key)"),
            &cost(&operator, operation),
            1 + write,
        );
    }
}

/// Any outcome, answered `200`, as the request layer records a keyed request's answer.
fn ok<T>(_: &T) -> StoredResponse {
    StoredResponse {
        status: 200,
        content_type: "application/json".into(),
        body: "{}".into(),
        headers: Vec::new(),
    }
}

#[test]
fn a_request_under_an_idempotency_key_costs_one_statement_more() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::new(dir.path(), Placement::Primary);
    let Expected {
        write,
        refused: refusal,
    } = ON_THE_PRIMARY;
    let keyed = |key: &'static str| KeyedRequest {
        caller_key_id: KEY_ID,
        idempotency_key: key,
        fingerprint: "fp".into(),
        now: from_millis(1_800_000_000_000),
    };
    let one = [unit(1)];

    // The key's look-up, then the request, whose write records the answer.
    let release = keyed("k-release");
    let cost = world.cost_of(|store, ctx| {
        assert_eq!(store.look_up(&release).unwrap(), Lookup::Fresh);
        let planned = store
            .capacity()
            .plan_capacity(ctx, &world.request(CapacityAction::Release, &one))
            .unwrap();
        let answer = ok(&planned.outcome);
        let written = store
            .write(
                ctx,
                planned,
                Some((&release, answer)),
                &mut WriteAttempts::default(),
            )
            .unwrap();
        assert!(
            matches!(written, Written::Done(_)),
            "the write recorded the answer"
        );
    });
    check("keyed release", &cost, 3 + write);

    // A refusal is recorded by a statement of its own.
    let refused = keyed("k-refused");
    let cost = world.cost_of(|store, ctx| {
        assert_eq!(store.look_up(&refused).unwrap(), Lookup::Fresh);
        let stranger = ["gpu-none".to_owned()];
        store
            .capacity()
            .plan_capacity(ctx, &world.request(CapacityAction::Release, &stranger))
            .err()
            .expect("a refusal plans no write");
        assert!(
            store
                .record_refusal(
                    &refused,
                    &StoredResponse {
                        status: 422,
                        content_type: "application/problem+json".into(),
                        body: "{}".into(),
                        headers: Vec::new(),
                    },
                )
                .unwrap()
        );
    });
    check("keyed refused release", &cost, 4 + refusal);

    // The same key again: its look-up replays the answer, and nothing else runs.
    let cost = world.cost_of(|store, _| {
        assert!(matches!(
            store.look_up(&release).unwrap(),
            Lookup::Replay(stored) if stored.status == 200
        ));
    });
    check("replayed release", &cost, 2);
}

#[test]
fn at_a_replica_reads_cost_the_same_and_every_write_is_refused_before_its_statement() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::new(dir.path(), Placement::Replica);
    world
        .memory
        .set(
            site::SITE_MEMORY_KEY,
            format!("forwards 1 {}", now_ms()).as_bytes(),
        )
        .unwrap();
    let get = world.cost_of(|store, ctx| {
        store
            .capacity()
            .read_reservation(ctx, NODE, RESERVATION)
            .unwrap();
    });
    check("GET reservation at a replica", &get, 2);
    let one = [unit(1)];
    let release = world.cost_of(|store, ctx| {
        let refused = store
            .capacity()
            .change_capacity(ctx, world.request(CapacityAction::Release, &one))
            .unwrap_err();
        assert!(
            refused.to_string().contains("home_url"),
            "refused for want of a home: {refused}"
        );
    });
    check("release at a replica (refused)", &release, 1);
}

#[test]
fn whether_the_database_forwards_writes_is_asked_once_and_remembered_a_while() {
    for placement in [Placement::Primary, Placement::Replica] {
        let dir = tempfile::tempdir().unwrap();
        let world = World::new(dir.path(), placement);
        // A read looks at the database's place after its first statement.
        let read = || {
            world.cost_of(|store, ctx| {
                store
                    .capacity()
                    .read_reservation(ctx, NODE, RESERVATION)
                    .unwrap();
            })
        };
        let probes = |cost: &Cost| {
            cost.statements
                .iter()
                .filter(|statement| statement.contains("site_probe_no_such_table"))
                .count()
        };
        // Not known yet: asked once, then remembered.
        world.memory.delete(site::SITE_MEMORY_KEY).unwrap();
        let asked = read();
        check(&format!("{placement:?}: asked"), &asked, 3);
        assert_eq!(probes(&asked), 1);
        let remembered = read();
        check(&format!("{placement:?}: remembered"), &remembered, 2);
        assert_eq!(probes(&remembered), 0);
        // Forgotten (a new key-value store, or the finding too old): asked again.
        let stale = format!(
            "forwards {} 1000",
            u8::from(placement == Placement::Replica)
        );
        world
            .memory
            .set(site::SITE_MEMORY_KEY, stale.as_bytes())
            .unwrap();
        assert_eq!(probes(&read()), 1, "a stale finding is asked again");
        assert_eq!(probes(&read()), 0);
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}
