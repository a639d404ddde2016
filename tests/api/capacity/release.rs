//! Release: what a release refuses and what releasing again changes.

use super::*;

#[test]
fn a_unit_running_a_community_or_verified_vm_is_not_released() {
    let world = World::open();
    let community = placed_vm(&world.audience, NODE, &["g0"], "community");
    let verified = placed_vm(&world.audience, NODE, &["g2"], "verified");
    let spot = placed_vm(&world.audience, NODE, &["g3"], "spot");
    let before = world.snapshot();
    for client in [&world.owner, &world.manager, &world.app.operator()] {
        let problem = world
            .call(client, Op::Release, &["g3", "g2", "g1", "g0"])
            .expect_problem(409, "units-not-idle");
        assert_eq!(strings(&problem["unitIds"]), sorted(["g0", "g2"]));
        assert_eq!(strings(&problem["vmIds"]), sorted([&community, &verified]));
    }
    assert_same_state(
        &before,
        &world.snapshot(),
        "nothing released, not even the idle units",
    );

    // A spot VM does not keep its unit off the market.
    let released = world.ok(Op::Release, &["g3", "g1"]);
    assert_eq!(released["releasedUnitIds"], json!(["g1", "g3"]));
    assert_eq!(world.vm(&spot)["status"], "running");
}

#[test]
fn releasing_a_released_unit_and_reclaiming_an_unreleased_one_change_nothing() {
    let world = World::open();
    world.ok(Op::Release, &["g1"]);
    let released = world.ok(Op::Release, &["g1", "g2"]);
    assert_eq!(released["releasedUnitIds"], json!(["g1", "g2"]));
    let again = world.ok(Op::Release, &["g2", "g1"]);
    assert_eq!(again["releasedUnitIds"], json!(["g1", "g2"]));
    let (_, _, units, terminated, skipped, reason) = world.last_event();
    assert_eq!(
        units,
        json!(["g2", "g1"]),
        "the no-op is still in the audit trail"
    );
    assert_eq!((terminated, skipped), (json!([]), json!([])));
    assert_eq!(reason.as_deref(), Some("release by test"));

    let audience_vm = placed_vm(&world.audience, NODE, &["g0"], "community");
    let reclaimed = world.ok(Op::Reclaim, &["g3"]);
    assert_eq!(reclaimed["releasedUnitIds"], json!(["g1", "g2"]));
    assert_eq!(reclaimed["terminated"], json!([]));
    assert_eq!(reclaimed["skipped"], json!([]));
    let reclaimed = world.ok(Op::Reclaim, &["g0", "g3"]);
    assert_eq!(reclaimed["releasedUnitIds"], json!(["g1", "g2"]));
    assert_eq!(reclaimed["terminated"], json!([]));
    assert_eq!(reclaimed["skipped"], json!([audience_vm]));
    assert_eq!(world.vm(&audience_vm)["status"], "running");

    world.ok(Op::Reclaim, &["g1"]);
    let twice = world.ok(Op::Reclaim, &["g1"]);
    assert_eq!(twice["releasedUnitIds"], json!(["g2"]));
}
