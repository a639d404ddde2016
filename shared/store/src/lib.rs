//! The system of record: every read and write of the reservations service, as SQL over the
//! [`Sql`] and [`KeyValue`] traits, asking `reservations-domain` for every decision.
//!
//! The components run this crate over Spin's SQLite and key-value interfaces; tests and
//! benchmarks run the very same code natively over rusqlite (feature `native`). Every
//! mutation reads its facts outside any transaction and is written by one statement that also
//! appends its audit event and records its idempotency key ([`mod@write`]), and every operation
//! touches only the rows it needs (O(units in the request)). The same code is correct on one
//! local file and on a libSQL server shared by many replicas.
//!
//! [`Store`]'s operations are grouped by concern, each a view of the store named after it, so
//! a call is followed by its name:
//!
//! | concern | module | `store.<concern>().…` |
//! | --- | --- | --- |
//! | [`Capacity`] | [`nodes`] | `put_node`, `get_node`, `list_nodes`, `read_node`, `node_summary` |
//! | | [`reservations`] | `create_reservation`, `cancel_reservation`, `reaffirm_reservation`, `read_reservation`, `list_reservations` |
//! | | [`capacity`] | `change_capacity` (release, reclaim, dry run) |
//! | | [`vms`] | `place_vm`, `terminate_vm`, `read_vm`, `list_vms` |
//! | [`Identity`] | [`orgs`] | `create_org`, `get_org`, `read_org` |
//! | | [`keys`] | `create_key`, `revoke_key`, `list_keys`, their operator twins, `key_with_secret_hash` |
//! | [`Trail`] | [`audit`] | `list_audit`, `read_audit`, `verify_audit` |
//! | [`Feed`] | [`feed`] | `read_feed`, `feed_head`, `events_head`, the waits |
//! | [`Market`] | [`market`] | `offers`, `read_market`, `units_for_sale` |
//!
//! Each mutation has a `plan_…` twin: its plan from fresh facts, which the request layer
//! writes itself (recording a keyed request's answer with it). What every concern shares is
//! [`Store`]'s own:
//!
//! | module | `Store::…` |
//! | --- | --- |
//! | [`write`](mod@write) | `write`: the one statement every mutation ends in, a plan at a time |
//! | [`idempotency`] | `look_up`, `claim_key`, `record_refusal` |
//! | [`site`] | where reads are served from: `copy_may_lag`, `bookmark_reach`, `await_copy`, positions |
//!
//! Beneath them all, [`storage`] is the boundary to the database (the one connection, rows
//! read by column name, every failure told apart once, the retry policy, the request's
//! tally); [`cells`] is what spans cells (which cell holds a node, a request's store per
//! cell, the merges of their pages).

pub mod audit;
pub mod capacity;
pub mod cells;
pub mod cursor;
pub mod feed;
pub mod idempotency;
pub mod keys;
pub mod market;
#[cfg(feature = "native")]
pub mod native;
pub mod nodes;
pub mod orgs;
pub mod reservations;
pub mod schema;
pub mod share;
pub mod site;
pub mod storage;
pub mod tx;
pub mod vms;
pub mod write;

use reservations_domain::access::Caller;
use reservations_domain::{DomainError, Timestamp};

pub use storage::{Counters, KeyValue, Sql, SqlRows, SqlValue, StorageError};

/// Why a store operation did not happen. Either way nothing was written.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreError {
    /// A rule refused the request.
    Domain(DomainError),
    /// The database failed (after retries, if it was busy).
    Storage(StorageError),
    /// Other writes kept moving the facts this one was planned on, `attempts` times.
    Contention { attempts: u32 },
    /// The writer's org had its whole share of writes running for as long as this one
    /// waited for a turn ([`share`]).
    ShareExhausted {
        share: i64,
        waited: std::time::Duration,
    },
    /// A request with the same idempotency key was carried out meanwhile: its record answers.
    AlreadyRecorded,
    /// The caller's key was revoked after the request was authenticated.
    KeyRevoked,
}

impl StoreError {
    /// Whether the same work may succeed if run again (the database was busy or out of
    /// reach); nothing of it was kept either way.
    pub fn is_transient(&self) -> bool {
        storage::is_transient(self)
    }

    /// Whether a rule found nothing of what was asked for.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::Domain(DomainError::NotFound { .. }))
    }
}

impl From<DomainError> for StoreError {
    fn from(e: DomainError) -> Self {
        StoreError::Domain(e)
    }
}

impl From<StorageError> for StoreError {
    fn from(e: StorageError) -> Self {
        StoreError::Storage(e)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Domain(e) => e.fmt(f),
            StoreError::Storage(e) => e.fmt(f),
            StoreError::Contention { attempts } => write!(
                f,
                "the facts this write depends on changed under it {attempts} times"
            ),
            StoreError::ShareExhausted { share, waited } => write!(
                f,
                "the org had {share} writes running for the {waited:?} this one waited"
            ),
            StoreError::AlreadyRecorded => {
                f.write_str("the idempotency key was recorded meanwhile")
            }
            StoreError::KeyRevoked => f.write_str("the caller's key was revoked"),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Who is acting, when, and under which request id: what every audit event records.
#[derive(Clone)]
pub struct Context<'a> {
    pub caller: &'a Caller,
    pub now: Timestamp,
    /// The server's own id of the request.
    pub request_id: &'a str,
    /// The id the client sent (`x-request-id`), recorded beside the server's.
    pub client_request_id: Option<&'a str>,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("caller", &self.caller)
            .field("now", &self.now)
            .field("request_id", &self.request_id)
            .field("client_request_id", &self.client_request_id)
            .finish()
    }
}

impl<'a> Context<'a> {
    /// A context for `caller` at `now`, with no client request id.
    pub fn new(caller: &'a Caller, now: Timestamp, request_id: &'a str) -> Context<'a> {
        Context {
            caller,
            now,
            request_id,
            client_request_id: None,
        }
    }
}

/// The database, as the rest of the system sees it.
pub struct Store<'a> {
    connection: storage::Connection<'a>,
    audit_key: &'a [u8],
    /// How many times the last mutation was planned ([`Store::write_attempts`]).
    write_attempts: std::cell::Cell<u32>,
    seen: site::Seen,
    site: site::Site<'a>,
    /// Each org's share of the writes ([`share`]); none: no shares.
    shares: Option<share::Shares<'a>>,
    /// In a cell other than the directory's: the directory's store, which has the orgs.
    directory: Option<&'a Store<'a>>,
}

impl<'a> Store<'a> {
    /// Opens the store on a connection and brings its schema up to date at once. Its audit
    /// chain is keyed with the empty key: for tests and tools; the app uses [`Store::keyed`].
    pub fn open(db: &'a dyn Sql) -> Result<Store<'a>> {
        schema::migrate(db)?;
        Store::keyed(db, &[])
    }

    /// Opens the store with the secret that keys the audit chain's hashes. Nothing is sent
    /// to the database: a schema that is behind is brought up to date by the first statement
    /// that needs it (see [`storage::Connection`]).
    pub fn keyed(db: &'a dyn Sql, audit_key: &'a [u8]) -> Result<Store<'a>> {
        Ok(Store {
            connection: storage::Connection::new(db, audit_key),
            audit_key,
            write_attempts: Default::default(),
            seen: Default::default(),
            site: Default::default(),
            shares: None,
            directory: None,
        })
    }

    /// Remembers in `memory` (the app's key-value store) whether the database (Spin's
    /// `label`) forwards writes, so that requests do not ask it each time ([`site`]).
    pub fn remembering_its_site(mut self, memory: &'a dyn KeyValue, label: &str) -> Store<'a> {
        self.site.memory = Some((memory, site::site_memory_key(label)));
        self
    }

    /// Lets at most `share` write statements of one org run at once, counted in `counters`
    /// ([`share`]).
    pub fn with_write_shares(mut self, counters: &'a dyn Counters, share: i64) -> Store<'a> {
        self.shares = Some(share::Shares { counters, share });
        self
    }

    /// A store of a cell other than the directory's, which asks `directory` what the
    /// directory holds ([`cells`]).
    pub fn with_directory(mut self, directory: &'a Store<'a>) -> Store<'a> {
        self.directory = Some(directory);
        self
    }

    pub(crate) fn db(&self) -> &storage::Connection<'a> {
        if self.connection.needs_placement() {
            self.connection.set_each_on_its_own(self.copy_may_lag());
        }
        &self.connection
    }

    pub(crate) fn audit_key(&self) -> &'a [u8] {
        self.audit_key
    }

    /// Whether a statement of this store found its database out of reach, or took no answer
    /// from it: health reports the database failing for a while (docs/design.md, "Cells").
    pub fn lost_its_database(&self) -> bool {
        self.connection.lost_the_database()
    }

    /// How many times the last mutation was planned and written (1 unless its facts moved).
    pub fn write_attempts(&self) -> u32 {
        self.write_attempts.get()
    }
}

/// The store's operations by concern, each a view of the one [`Store`]: a call is followed
/// by its concern's name (`store.capacity().place_vm(…)`), and what every concern shares (the
/// connection, the write statement, the site's positions) stays [`Store`]'s.
macro_rules! concerns {
    ($($(#[$doc:meta])* $name:ident: $accessor:ident;)+) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'s, 'a>(&'s Store<'a>);

        impl<'s, 'a> std::ops::Deref for $name<'s, 'a> {
            type Target = Store<'a>;

            fn deref(&self) -> &Store<'a> {
                self.0
            }
        }

        impl<'a> Store<'a> {
            $(#[$doc])*
            pub fn $accessor(&self) -> $name<'_, 'a> {
                $name(self)
            }
        }
    )+};
}

concerns! {
    /// The facts of capacity: nodes and their units ([`nodes`]), reservations
    /// ([`reservations`]), releases, reclaims and dry runs ([`capacity`]), VMs ([`vms`]).
    Capacity: capacity;
    /// Who may act: orgs ([`orgs`]), their API keys and operator keys ([`keys`]).
    Identity: identity;
    /// The audit trail: its listing (`audit/listing.rs`) and its verification
    /// (`audit/verify.rs`).
    Trail: trail;
    /// The events feed ([`feed`]).
    Feed: feed;
    /// The spot market: the units for sale ([`market`]).
    Market: market;
}

/// A page of a listing and the cursor of the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
    /// Rows of the page that could not be read (a damaged column): for operators to see,
    /// skipped for everyone else, never an error that hides the rest of the listing.
    pub unreadable: Vec<UnreadableRow>,
}

/// A stored row that cannot be read, named by its key (its id, or what the listing orders by).
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadableRow {
    pub key: String,
    pub error: String,
}

impl<T> Page<T> {
    pub(crate) fn empty() -> Page<T> {
        Page {
            items: Vec::new(),
            next_cursor: None,
            unreadable: Vec::new(),
        }
    }

    /// A page from a query that fetched one row more than `limit`: that extra row only says
    /// a next page exists, whose cursor is the last item kept.
    pub(crate) fn from_overfetched(
        items: Vec<T>,
        limit: usize,
        cursor_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        Page::from_overfetched_rows(items.into_iter().map(Ok).collect(), limit, cursor_of)
    }

    /// [`Page::from_overfetched`] over rows some of which could not be read: they count
    /// towards the page and move its cursor like any other.
    pub(crate) fn from_overfetched_rows(
        mut rows: Vec<std::result::Result<T, UnreadableRow>>,
        limit: usize,
        cursor_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|row| match row {
                Ok(item) => cursor_of(item),
                Err(unreadable) => unreadable.key.clone(),
            })
        } else {
            None
        };
        let mut page = Page::empty();
        page.next_cursor = next_cursor;
        for row in rows {
            match row {
                Ok(item) => page.items.push(item),
                Err(unreadable) => page.unreadable.push(unreadable),
            }
        }
        page
    }

    /// The same page with each item mapped, failing items set aside as unreadable.
    pub(crate) fn try_map<U>(
        self,
        mut read: impl FnMut(T) -> std::result::Result<U, UnreadableRow>,
    ) -> Page<U> {
        let mut page = Page {
            items: Vec::new(),
            next_cursor: self.next_cursor,
            unreadable: self.unreadable,
        };
        for item in self.items {
            match read(item) {
                Ok(item) => page.items.push(item),
                Err(unreadable) => page.unreadable.push(unreadable),
            }
        }
        page
    }
}
