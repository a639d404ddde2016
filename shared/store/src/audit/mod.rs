//! The audit trail: one event per mutation, appended by the mutation's own write statement
//! (see [`crate::write`]), each MACed on its own content and sealed into its chain by the
//! writes that follow, so that editing, deleting, reordering or inserting any event breaks its
//! chain from there on (docs/design.md, "The audit chains").
//!
//! Each node has its own chain (`node:<id>`: the node, its reservations and units, the VMs on
//! it), and the events about orgs, keys and operator keys have one of their own
//! (`platform`): writes about different nodes never wait for each other's place in a chain.
//! An event's place is `(chain, chainSeq)`; `seq` is its place in the whole trail, the order
//! listings and the feed use.
//!
//! Events are written as version 5: the write statement gives the event its place (the next
//! of its chain) and its `prevHash` (the hash of the one before), so a write needs nothing of
//! the chain when it is planned; `hash` is HMAC-SHA-256, keyed with the app's secret
//! `audit_key`, over the event's content with `afterSeq`, the newest place of its chain its
//! writer had seen. The next writes on the chain seal it: `seal` is the MAC of the seal before
//! it, its place and its hash ([`seal_link`]), the same whoever computes it. So rewriting an
//! event needs the key, and once sealed so does moving, dropping or inserting one; before
//! that, at the chain's unsealed tail, places must still run without a gap and an event can
//! only sit after every event its writer saw. Events of version 4 (HMAC over the previous
//! hash and the content with the place) stay as they were written; databases written before
//! per-node chains keep their events in one chain, `trail`, closed to new events, sealed again
//! as version 4 when their schema was migrated (see [`seal`]); no other version
//! verifies.
//!
//! The event itself, its content, hash and seal and its row, and what a write reads of its
//! chain (`Basis`) and the seals it adds, are in `event.rs`; the listings of the
//! trail, in `listing.rs`; the sealing of earlier builds' events, in `seal.rs`; verifying the
//! chains, in `verify.rs`.

mod event;
mod listing;
pub(crate) mod seal;
mod verify;

pub use event::{
    ACTIONS, AuditEvent, CHAINED_HASH_VERSION, GENESIS_HASH, HASH_VERSION, NewEvent, TRAIL_CHAIN,
    seal_link,
};
pub(crate) use event::{Basis, basis_column, read_basis};
pub(crate) use event::{
    COLUMNS, COLUMNS_BEFORE_SEALS, deadlines_json, read_event, visibility_json,
};
pub use listing::{AuditFilter, FEED_ACTIONS, Listed, MAX_AUDIT_PAGE};
pub use verify::{ChainPin, ChainState, ChainVerification};
