//! Who may terminate a VM, and what its termination records.

use super::*;

#[track_caller]
fn terminated_by(client: &Client, vm: &str, reason: &str) {
    let vm = client
        .delete(&format!("/v1/vms/{vm}"))
        .expect_status(200)
        .json();
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminationReason"], reason);
    assert!(vm["terminatedAt"].is_string());
}

#[test]
fn who_may_terminate_a_vm() {
    let market = Market::open();
    let app = &market.app;
    market.release(&["g1", "g2", "g3"]);
    let audience_vm = placed_vm(&market.audience, NODE, &["g0"], "community");
    let spot_for_owner = placed_vm(&market.outsider, NODE, &["g1"], "spot");
    let spot_for_manager = placed_vm(&market.outsider, NODE, &["g2"], "spot");
    let spot_for_operator = placed_vm(&market.outsider, NODE, &["g3"], "spot");
    let unreserved_spot = placed_vm(&market.audience, NODE, &["g5"], "spot");

    // The capacity owners (node owner, managing org) stop spot VMs on the reserved units
    // with reservation.capacity...
    terminated_by(
        &market.owner,
        &spot_for_owner,
        "terminated-by-capacity-owner",
    );
    terminated_by(
        &market.manager,
        &spot_for_manager,
        "terminated-by-capacity-owner",
    );
    app.key(MANAGER, "admin", Some(&["reservation.capacity"]))
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_status(200);
    let spot_for_operator = placed_vm(&market.outsider, NODE, &["g3"], "spot");
    // ...but not without it, not a community VM, and not a VM on units they do not reserve.
    app.key(MANAGER, "viewer", None)
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_problem(403, "forbidden");
    market
        .manager
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    market
        .owner
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    market
        .owner
        .delete(&format!("/v1/vms/{unreserved_spot}"))
        .expect_problem(404, "not-found");
    // Strangers learn nothing; the VM's org needs vm.write.
    market
        .outsider
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(404, "not-found");
    market
        .other_audience
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(404, "not-found");
    app.key(AUDIENCE, "viewer", None)
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(403, "forbidden");
    app.anonymous()
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(401, "unauthorized");
    market
        .audience
        .delete("/v1/vms/vm-does-not-exist")
        .expect_problem(404, "not-found");

    terminated_by(&market.audience, &audience_vm, "stopped");
    terminated_by(&app.operator(), &spot_for_operator, "stopped-by-operator");
    terminated_by(&market.audience, &unreserved_spot, "stopped");

    // Terminating twice is a conflict, whoever asks.
    market
        .audience
        .delete(&format!("/v1/vms/{audience_vm}"))
        .expect_problem(409, "vm-terminated");
    market
        .owner
        .delete(&format!("/v1/vms/{spot_for_owner}"))
        .expect_problem(409, "vm-terminated");
    app.operator()
        .delete(&format!("/v1/vms/{spot_for_operator}"))
        .expect_problem(409, "vm-terminated");

    // Every unit is free again, and the terminated VMs remain readable.
    assert!(market.running_units().is_empty());
    let vm = market
        .audience
        .get(&format!("/v1/vms/{audience_vm}"))
        .expect_status(200)
        .json();
    assert_eq!(vm["terminationReason"], "stopped");
    placed_vm(&market.audience, NODE, &["g0"], "verified");
    placed_vm(&market.outsider, NODE, &["g1", "g2", "g3"], "spot");
}
