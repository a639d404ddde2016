//! Who lists which events, and the listing's filters, time ranges and cursors.

use super::*;
use api_support::contract::operators_only_event_fields;

#[test]
fn operators_see_everything_and_orgs_only_their_own() {
    let app = App::start();
    let (owner, tenant, stranger, rid, _) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    assert_eq!(everything.len() as i64, event_count(&app));

    let owner_sees = all_events(&owner, "");
    let tenant_sees = all_events(&tenant, "");
    let stranger_sees = all_events(&stranger, "");
    let concerns = |event: &Value, org: &str| {
        event["orgId"] == org || event["actorOrgId"] == org || event["nodeId"] == "n1"
    };
    // The owner: its org and keys, its node, the reservation on it, VMs on its units.
    assert!(
        owner_sees.iter().all(|e| concerns(e, "owner")),
        "{owner_sees:?}"
    );
    for action in [
        "org.create",
        "apikey.create",
        "node.create",
        "reservation.create",
        "reservation.release",
        "vm.place",
    ] {
        assert!(
            actions(&owner_sees).contains(&action.to_owned()),
            "owner misses {action}"
        );
    }
    // The tenant: its org and keys, the reservation it is the audience of, its VM; not the
    // owner's node registration or the owner's keys.
    assert_eq!(
        actions(&tenant_sees),
        [
            "org.create",
            "apikey.create",
            "apikey.create",
            "reservation.create",
            "reservation.release",
            "vm.place"
        ]
    );
    assert!(tenant_sees.iter().all(|e| e["orgId"] != "owner"));
    assert!(
        tenant_sees
            .iter()
            .filter(|e| e["reservationId"].is_string())
            .all(|e| e["reservationId"] == rid.as_str())
    );
    // The stranger: its own org and keys only.
    assert_eq!(actions(&stranger_sees), ["org.create", "apikey.create"]);
    assert!(stranger_sees.iter().all(|e| e["orgId"] == "stranger"));
    assert!(all_events(&stranger, "&nodeId=n1").is_empty());
    assert!(all_events(&stranger, &format!("&reservationId={rid}")).is_empty());

    // Orgs see a subset of the operator's trail, events identical but for what the contract
    // shows to operators only (who else sees each event, its places in its chain).
    let operators_only = operators_only_event_fields();
    assert!(
        operators_only.contains("chainSeq") && operators_only.contains("visibleTo"),
        "{operators_only:?}"
    );
    let as_principals_see: Vec<Value> = everything
        .iter()
        .map(|event| {
            let mut event = event.clone();
            let object = event.as_object_mut().expect("an event object");
            for field in &operators_only {
                let removed = object.remove(field);
                // The newest event of each chain is not sealed yet.
                if field != "seal" {
                    assert!(removed.is_some(), "{field}");
                }
            }
            event
        })
        .collect();
    for seen in [&owner_sees, &tenant_sees, &stranger_sees] {
        for event in seen.iter() {
            assert!(
                as_principals_see.contains(event),
                "{event} is not the operator's"
            );
        }
    }

    // Without audit.read: 403, whatever the role's other permissions.
    for (role, permissions) in [
        ("member", None),
        ("viewer", None),
        ("admin", Some(&["node.read", "reservation.read"][..])),
    ] {
        app.key("owner", role, permissions)
            .get("/v1/audit")
            .expect_problem(403, "forbidden");
    }
    app.anonymous()
        .get("/v1/audit")
        .expect_problem(401, "unauthorized");
}

#[test]
fn filters_time_ranges_and_cursor_pagination() {
    let app = App::start();
    // Three orgs created at distinct, known times, then the rest of the world now.
    for (hours, org) in [(-3, "early"), (-2, "middle"), (-1, "late")] {
        app.set_clock_offset_secs(hours * 3600);
        app.org(org);
    }
    app.set_clock_offset_secs(0);
    let (_, _, _, rid, vm) = shared_world(&app);
    let operator = app.operator();
    let everything = all_events(&operator, "");
    let at = |org: &str| {
        everything
            .iter()
            .find(|e| e["action"] == "org.create" && e["orgId"] == org)
            .expect("org event")["at"]
            .as_str()
            .expect("at")
            .to_owned()
    };
    let orgs_of = |events: Vec<Value>| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["action"] == "org.create")
            .map(|e| e["orgId"].as_str().expect("orgId").to_owned())
            .collect()
    };

    // since is inclusive, until exclusive.
    let middle = at("middle");
    let late = at("late");
    assert_eq!(
        orgs_of(all_events(
            &operator,
            &format!("&since={middle}&until={late}")
        )),
        ["middle"]
    );
    assert_eq!(
        orgs_of(all_events(&operator, &format!("&until={middle}"))),
        ["early"]
    );
    let recent = all_events(&operator, &format!("&since={}", rfc3339_from_now(-600)));
    assert!(
        recent
            .iter()
            .all(|e| e["orgId"] != "early" && e["orgId"] != "late")
    );
    assert_eq!(recent.len() + 3, everything.len());
    // Any offset is accepted.
    let middle_plus_one = chrono::DateTime::parse_from_rfc3339(&middle)
        .unwrap()
        .with_timezone(&chrono::FixedOffset::east_opt(3600).unwrap())
        .to_rfc3339()
        .replace('+', "%2B");
    assert_eq!(
        orgs_of(all_events(
            &operator,
            &format!("&since={middle_plus_one}&until={late}")
        )),
        ["middle"]
    );

    // nodeId, reservationId, action, and their combination.
    let on_node = all_events(&operator, "&nodeId=n1");
    assert_eq!(
        actions(&on_node),
        [
            "node.create",
            "reservation.create",
            "reservation.release",
            "vm.place"
        ]
    );
    let on_reservation = all_events(&operator, &format!("&reservationId={rid}"));
    assert_eq!(
        actions(&on_reservation),
        ["reservation.create", "reservation.release"]
    );
    let combined = all_events(&operator, "&nodeId=n1&action=vm.place");
    assert_eq!(combined.len(), 1);
    assert_eq!(combined[0]["vmId"], vm.as_str());
    assert!(all_events(&operator, "&nodeId=n2").is_empty());

    // Pages of two, in order, each event once, the last page without a cursor.
    let mut paged: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/audit?limit=2".to_owned(),
            Some(c) => format!("/v1/audit?limit=2&cursor={c}"),
        };
        let page = operator.get(&path).expect_status(200).json();
        let items = page["items"].as_array().expect("items").clone();
        assert!(items.len() <= 2);
        pages += 1;
        paged.extend(items);
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 100, "the cursor does not advance");
    }
    assert_eq!(paged, everything);
    assert_eq!(pages, everything.len().div_ceil(2));
    // Oldest first: by the time each event records (across cells; in one, that is its order).
    let times: Vec<&str> = paged.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {times:?}"
    );
    // A filtered listing pages the same way.
    let first = operator
        .get("/v1/audit?action=org.create&limit=1")
        .expect_status(200)
        .json();
    let next = first["nextCursor"].as_str().expect("more org events");
    let second = operator
        .get(&format!(
            "/v1/audit?action=org.create&limit=1&cursor={next}"
        ))
        .expect_status(200)
        .json();
    assert_eq!(second["items"][0]["orgId"], "middle");

    // Malformed parameters are 400 naming the parameter.
    for (query, parameter) in [
        ("cursor=abc", "cursor"),
        ("since=yesterday", "since"),
        ("until=2026-13-01T00:00:00Z", "until"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("action=vm.explode", "action"),
        ("nodeId=a&nodeId=b", "nodeId"),
        ("node=n1", "node"),
    ] {
        let problem = operator
            .get(&format!("/v1/audit?{query}"))
            .expect_status(400)
            .json();
        assert_eq!(problem["parameter"], parameter, "{query}: {problem}");
    }
}
