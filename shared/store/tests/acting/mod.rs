//! Who acts in the store's tests, and when (a key of an org, one fixed request time), and the
//! reservation they most often act on: open-ended, from the epoch.

use reservations_domain::access::{Caller, Role};
use reservations_domain::reservation::{NewReservation, Term};
use reservations_domain::time::from_millis;
use reservations_store::Context;

/// A key of `org` with `role`'s permissions.
pub fn org_key(org: &str, role: Role) -> Caller {
    Caller {
        key_id: format!("key-{org}"),
        org_id: Some(org.to_owned()),
        permissions: role.permissions(),
    }
}

/// `caller`'s request, at one fixed time.
pub fn ctx(caller: &Caller) -> Context<'_> {
    Context {
        caller,
        now: from_millis(1_800_000_000_000),
        request_id: "req-1",
        client_request_id: None,
    }
}

/// A reservation of `units` for `audience`, from the epoch with no end.
pub fn open_ended_reservation(units: Vec<String>, audience: Vec<String>) -> NewReservation {
    NewReservation {
        reserved_unit_ids: units,
        allowed_org_ids: audience,
        managing_org_ids: Vec::new(),
        term: Term {
            starts_at: from_millis(0),
            ends_at: None,
        },
        contract_ref: None,
        reason: None,
    }
}
