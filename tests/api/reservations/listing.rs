//! Listing a node's reservations: filters, order and cursors.

use super::*;

#[test]
fn the_list_filters_by_status_and_pages_with_a_cursor() {
    let app = App::start();
    for org in ["owner", "tenant", "broker", "stranger"] {
        app.org(org);
    }
    let units: Vec<String> = (0..25).map(|i| format!("u{i:02}")).collect();
    let unit_refs: Vec<&str> = units.iter().map(String::as_str).collect();
    app.node(NODE, "owner", &unit_refs);

    let mut all = Vec::new();
    let mut cancelled = Vec::new();
    let mut pending = Vec::new();
    for (i, unit) in unit_refs.iter().enumerate() {
        let future = i % 3 == 1;
        let starts_at = if future {
            rfc3339_from_now(3600)
        } else {
            rfc3339_from_now(-3600)
        };
        let id = created(&app, &[unit], &starts_at, None);
        if i % 5 == 4 {
            app.operator()
                .post(&format!("{}/cancel", reservation_path(&id)), &json!({}))
                .expect_status(200);
            cancelled.push(id.clone());
        } else if future {
            pending.push(id.clone());
        }
        all.push(id);
    }
    let viewer = app.key("tenant", "viewer", None);

    // The default page holds 20.
    let first = viewer.get(&reservations_path()).expect_status(200).json();
    assert_eq!(ids(&first).len(), 20);
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = viewer
        .get(&format!("{}?cursor={cursor}", reservations_path()))
        .expect_status(200)
        .json();
    assert_eq!(ids(&second).len(), 5);
    assert!(second.get("nextCursor").is_none(), "{second}");
    let mut paged = ids(&first);
    paged.extend(ids(&second));

    let (items, pages) = list_all(&viewer, "", 7);
    assert_eq!(pages, 4);
    let listed: Vec<String> = items.iter().map(id_of).collect();
    assert_eq!(listed, paged, "any page size gives the same order");
    assert_eq!(
        sorted(listed.clone()),
        sorted(all.clone()),
        "each exactly once"
    );
    let created_at: Vec<&str> = items
        .iter()
        .map(|r| r["createdAt"].as_str().unwrap())
        .collect();
    assert!(created_at.windows(2).all(|w| w[0] <= w[1]), "oldest first");
    let (items, pages) = list_all(&viewer, "", 100);
    assert_eq!((items.len(), pages), (25, 1));
    let (items, pages) = list_all(&viewer, "", 25);
    assert_eq!((items.len(), pages), (25, 1), "no empty last page");

    let (items, _) = list_all(&viewer, "status=cancelled", 2);
    assert_eq!(sorted(items.iter().map(id_of)), sorted(cancelled.clone()));
    assert!(items.iter().all(|r| r["status"] == "cancelled"));
    let (items, _) = list_all(&viewer, "status=pending", 3);
    assert_eq!(sorted(items.iter().map(id_of)), sorted(pending.clone()));
    let (items, _) = list_all(&viewer, "status=active,pending", 4);
    let mut live: Vec<String> = all
        .iter()
        .filter(|id| !cancelled.contains(id))
        .cloned()
        .collect();
    live.sort();
    assert_eq!(sorted(items.iter().map(id_of)), live);
    // The parameter repeated, as clients generated from the OpenAPI document send a list
    // (form style, exploded), means the same; so does a mix of both forms.
    let (items, _) = list_all(&viewer, "status=active&status=pending", 4);
    assert_eq!(sorted(items.iter().map(id_of)), live);
    let (items, _) = list_all(&viewer, "status=active&status=pending,cancelled", 100);
    assert_eq!(items.len(), all.len());
    let (items, _) = list_all(&viewer, "status=pending,cancelled", 100);
    assert_eq!(items.len(), pending.len() + cancelled.len());
    let (items, _) = list_all(&viewer, "status=expired,needs-review", 5);
    assert!(items.is_empty());

    // The clock moves the filter with it: the pending ones become active.
    app.set_clock_offset_secs(3600 + 60);
    let (items, _) = list_all(&viewer, "status=pending", 5);
    assert!(items.is_empty());
    let (items, _) = list_all(&viewer, "status=active", 5);
    assert_eq!(items.len(), live.len());

    for bad in ["status=done", "status=active,", "status=Active"] {
        viewer
            .get(&format!("{}?{bad}", reservations_path()))
            .expect_problem(400, "invalid-parameter");
    }
    for bad in ["limit=0", "limit=101", "limit=ten"] {
        viewer
            .get(&format!("{}?{bad}", reservations_path()))
            .expect_problem(400, "invalid-parameter");
    }
    viewer
        .get(&format!(
            "{}?status=active&status=done",
            reservations_path()
        ))
        .expect_problem(400, "invalid-parameter");
    viewer
        .get(&format!("{}?limit=5&limit=6", reservations_path()))
        .expect_problem(400, "repeated-parameter");
    viewer
        .get(&format!("{}?order=desc", reservations_path()))
        .expect_problem(400, "unknown-parameter");
    viewer
        .get("/v1/nodes/n-missing/reservations")
        .expect_problem(404, "not-found");
}
