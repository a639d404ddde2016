//! Who acts in the store's tests, and when: a key of an org, and one fixed request time.

use reservations_domain::access::{Caller, Role};
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
