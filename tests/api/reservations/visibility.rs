//! Who sees which reservation.

use super::*;

#[test]
fn only_the_parties_and_operators_see_a_reservation() {
    let app = market();
    let shared = created(&app, &["g0"], &rfc3339_from_now(-60), None);
    let private = create(
        &app.operator(),
        &json!({
            "reservedUnitIds": ["g1"],
            "allowedOrgIds": ["owner"],
            "startsAt": rfc3339_from_now(-60),
        }),
    )
    .expect_status(201)
    .json();
    let private = id_of(&private);

    for (who, key) in [
        ("operator", app.operator()),
        ("owner", app.key("owner", "viewer", None)),
        ("audience", app.key("tenant", "viewer", None)),
        ("manager", app.key("broker", "viewer", None)),
    ] {
        let read = key
            .get(&reservation_path(&shared))
            .expect_status(200)
            .json();
        assert_eq!(read["id"], shared, "{who}");
        let (items, _) = list_all(&key, "", 100);
        assert!(items.iter().any(|r| r["id"] == shared), "{who} lists it");
        let sees_private = matches!(who, "operator" | "owner");
        assert_eq!(
            items.iter().any(|r| r["id"] == private),
            sees_private,
            "{who} and the private one"
        );
    }

    let stranger = app.key("stranger", "admin", None);
    let problem = stranger
        .get(&reservation_path(&shared))
        .expect_problem(404, "not-found");
    let missing = stranger
        .get(&reservation_path("rsv-0000000000000000"))
        .expect_problem(404, "not-found");
    assert_eq!(
        problem["detail"], missing["detail"],
        "existence is not leaked"
    );
    let list = stranger.get(&reservations_path()).expect_status(200).json();
    assert_eq!(list["items"], json!([]));
    for status in ["active", "needs-review"] {
        let filtered = stranger
            .get(&format!("{}?status={status}", reservations_path()))
            .expect_status(200)
            .json();
        assert_eq!(filtered["items"], json!([]));
    }
    app.key("tenant", "viewer", None)
        .get(&reservation_path(&private))
        .expect_problem(404, "not-found");

    // A party without reservation.read is refused, not misled.
    let narrowed = app.key("tenant", "admin", Some(&["node.read", "vm.read"]));
    narrowed
        .get(&reservation_path(&shared))
        .expect_problem(403, "forbidden");
    let problem = narrowed
        .get(&reservations_path())
        .expect_problem(403, "forbidden");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("reservation.read"),
        "{problem}"
    );

    // The reservation lives under its node only.
    app.node("n2", "owner", &["g0"]);
    app.operator()
        .get(&format!("/v1/nodes/n2/reservations/{shared}"))
        .expect_problem(404, "not-found");
    app.anonymous()
        .get(&reservation_path(&shared))
        .expect_problem(401, "unauthorized");
}
