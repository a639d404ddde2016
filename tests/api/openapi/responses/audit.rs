//! The audit trail and the events feed.

use super::*;

/// The audit trail and its verification.
pub(super) fn audit(cast: &Cast<'_>, reservation: &Reservation) {
    let Cast {
        anonymous,
        operator,
        owner,
        tenant,
        ..
    } = cast;
    let rid = &reservation.id;
    let events = owner
        .get("/v1/audit?nodeId=n1&limit=3")
        .expect_status(200)
        .json();
    assert!(events["nextCursor"].is_string(), "{events}");
    owner
        .get(&format!(
            "/v1/audit?reservationId={rid}&action=reservation.reclaim&since={}",
            rfc3339_from_now(-600).replace('+', "%2B")
        ))
        .expect_status(200);
    owner
        .get("/v1/audit?action=reservation.explode")
        .expect_problem(400, "invalid-parameter");
    tenant.get("/v1/audit").expect_problem(403, "forbidden");
    operator.get("/v1/audit/verify").expect_status(200);
    owner
        .get("/v1/audit/verify")
        .expect_problem(403, "forbidden");
    operator
        .get("/v1/audit/verify?deep=1")
        .expect_problem(400, "unknown-parameter");
    anonymous
        .get("/v1/audit/verify")
        .expect_problem(401, "unauthorized");
}

/// The events feed, with its bound on waiting polls.
pub(super) fn events_feed(cast: &Cast<'_>) {
    let Cast {
        owner,
        tenant,
        spec,
        ..
    } = cast;
    let feed = owner.get("/v1/events?limit=2").expect_status(200).json();
    let cursor = feed["nextCursor"].as_str().expect("a cursor").to_owned();
    tenant
        .get(&format!("/v1/events?after={cursor}&wait=0"))
        .expect_status(200);
    owner
        .get("/v1/events?wait=31")
        .expect_problem(400, "invalid-parameter");
    spec.caller(cast.issue("owner", "admin", Some(&["node.read"])))
        .get("/v1/events")
        .expect_problem(403, "forbidden");
    // A key with four polls waiting may not open a fifth.
    let poller = cast.issue("owner", "viewer", None);
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let poller = poller.clone();
            std::thread::spawn(move || {
                poller.get(&format!(
                    "/v1/events?after={}&wait=10",
                    api_support::positions::beyond_every_event()
                ))
            })
        })
        .collect();
    let poller_key = api_support::key_id(&poller);
    api_support::until(
        "the key's four polls hold their places",
        std::time::Duration::from_secs(60),
        || cast.app.feed_waits_of(&poller_key) == 4,
    );
    spec.caller(poller)
        .get(&format!(
            "/v1/events?after={}&wait=10",
            api_support::positions::beyond_every_event()
        ))
        .expect_problem(429, "too-many-waits");
    for poll in waiting {
        poll.join().expect("a waiting poll").expect_status(200);
    }
}
