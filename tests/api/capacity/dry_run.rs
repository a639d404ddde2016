//! The dry run: writes nothing, and answers for the current state.

use super::*;

#[test]
fn a_dry_run_writes_nothing_and_always_answers_for_the_current_state() {
    let world = World::open();
    world.ok(Op::Release, &["g1", "g2", "g3"]);
    let audience_vm = placed_vm(&world.audience, NODE, &["g0"], "community");
    let first_spot = placed_vm(&world.outsider, NODE, &["g1"], "spot");

    let keyed = world.owner.with_header("idempotency-key", "dry-run-1");
    let before = world.snapshot();
    let reservation_before = world.reservation();
    for client in [&world.owner, &keyed, &world.manager, &world.app.operator()] {
        let answer = world
            .call(client, Op::DryRun, &["g0", "g1", "g2", "g3"])
            .expect_status(200)
            .json();
        assert_eq!(answer["wouldTerminate"], json!([first_spot]));
        assert_eq!(answer["wouldSkip"], json!([audience_vm]));
        let mut reservation = answer.clone();
        let object = reservation.as_object_mut().unwrap();
        object.remove("wouldTerminate");
        object.remove("wouldSkip");
        assert_eq!(reservation, reservation_before, "the reservation as it is");
    }
    // Refused dry runs write nothing either.
    world
        .call(&keyed, Op::DryRun, &["g0", "g0"])
        .expect_problem(422, "duplicate-ids");
    world
        .call(&world.audience, Op::DryRun, &["g0"])
        .expect_problem(404, "not-found");
    assert_same_state(
        &before,
        &world.snapshot(),
        "no state, audit row or idempotency record",
    );

    // The state changes: the same key, the same body, a new answer.
    let second_spot = placed_vm(&world.outsider, NODE, &["g2", "g3"], "spot");
    let reply = world
        .call(&keyed, Op::DryRun, &["g0", "g1", "g2", "g3"])
        .expect_status(200);
    assert_eq!(reply.header("idempotent-replayed"), None);
    let answer = reply.json();
    assert_eq!(
        answer["wouldTerminate"],
        json!(sorted([&first_spot, &second_spot]))
    );
    assert_eq!(answer["wouldSkip"], json!([audience_vm]));
    // The same key with another body is not a reuse: nothing was recorded under it.
    let answer = world
        .call(&keyed, Op::DryRun, &["g3"])
        .expect_status(200)
        .json();
    assert_eq!(answer["wouldTerminate"], json!([second_spot]));

    // The reclaim does what the dry run said.
    let reclaimed = world.ok(Op::Reclaim, &["g0", "g1", "g2", "g3"]);
    assert_eq!(
        reclaimed["terminated"],
        json!(sorted([&first_spot, &second_spot]))
    );
    assert_eq!(reclaimed["skipped"], json!([audience_vm]));
    let after = world.ok(Op::DryRun, &["g0", "g1", "g2", "g3"]);
    assert_eq!(after["wouldTerminate"], json!([]));
    assert_eq!(after["wouldSkip"], json!([audience_vm]));
    assert_eq!(after["releasedUnitIds"], json!([]));
}
