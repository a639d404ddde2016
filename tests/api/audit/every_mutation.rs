//! Every mutation appends exactly one event, with all its fields, and every action the trail knows
//! is listed and filtered by.

use super::*;

#[test]
fn every_mutation_appends_one_event_with_all_its_fields() {
    let app = App::start();
    // The components create the schema on first use.
    app.anonymous().get("/v1/healthz").expect_status(200);
    let (actors, spare_id) = orgs_and_keys_are_audited(&app);
    let rid = nodes_reservations_and_releases_are_audited(&app, &actors);
    let reservation = format!("/v1/nodes/n1/reservations/{rid}");
    vms_and_reclaims_are_audited(&app, &actors, &rid, &reservation);
    later_changes_are_audited(&app, &actors, &rid, &reservation, &spare_id);
    every_action_appeared_and_filters(&actors.operator);
}

/// Creating orgs and keys; returns the actors and the id of a spare key made by the owner.
fn orgs_and_keys_are_audited(app: &App) -> (Actors, String) {
    let operator = app.operator();
    let event = one_event(app, || {
        traced(&operator, "rq-org").post("/v1/orgs", &json!({ "id": "owner", "name": "Owner" }))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "org.create", "visibleTo": ["owner"], "vmOwners": [], "orgId": "owner",
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-org",
        })
    );
    app.org("tenant");

    let event = one_event(app, || {
        operator.post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "owner admin", "role": "admin" }),
        )
    });
    // The event names the key by id, never its secret.
    let keys = operator
        .get("/v1/orgs/owner/keys")
        .expect_status(200)
        .json();
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "apikey.create", "visibleTo": ["owner"], "vmOwners": [], "orgId": "owner",
            "subjectId": keys["items"][0]["id"],
            "unitIds": [], "terminated": [], "skipped": [],
        })
    );
    let owner = app.key("owner", "admin", None);
    let owner_key = key_id(&owner);
    let tenant = app.key("tenant", "member", None);
    let tenant_key = key_id(&tenant);

    let mut spare_id = String::new();
    let event = one_event(app, || {
        let reply = traced(&owner, "rq-key").post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "spare", "role": "viewer" }),
        );
        spare_id = reply.json()["id"].as_str().expect("id").to_owned();
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "apikey.create", "visibleTo": ["owner"], "vmOwners": [],
            "orgId": "owner", "subjectId": spare_id,
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-key",
        })
    );
    let actors = Actors {
        operator,
        owner,
        owner_key,
        tenant,
        tenant_key,
    };
    (actors, spare_id)
}

/// Creating a node and a reservation, releasing units; returns the reservation's id.
fn nodes_reservations_and_releases_are_audited(app: &App, actors: &Actors) -> String {
    let Actors {
        operator,
        owner,
        owner_key,
        ..
    } = actors;
    let units = ["u0", "u1", "u2", "u3", "u4", "u5"];
    let event = one_event(app, || {
        traced(operator, "rq-node").put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": units }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "node.create", "visibleTo": ["owner"], "vmOwners": [], "nodeId": "n1",
            "orgId": "owner", "unitIds": units, "terminated": [], "skipped": [],
            "clientRequestId": "rq-node",
        })
    );

    let mut rid = String::new();
    let event = one_event(app, || {
        let reply = traced(owner, "rq-reserve").post(
            "/v1/nodes/n1/reservations",
            &json!({
                "reservedUnitIds": ["u0", "u1", "u2", "u3"],
                "allowedOrgIds": ["tenant"],
                "managingOrgIds": ["tenant"],
                "startsAt": rfc3339_from_now(-3600),
                "reason": "contract 7",
            }),
        );
        rid = reply.json()["id"].as_str().expect("id").to_owned();
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.create", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u1", "u2", "u3"],
            "terminated": [], "skipped": [], "reason": "contract 7", "clientRequestId": "rq-reserve",
        })
    );
    let reservation = format!("/v1/nodes/n1/reservations/{rid}");

    let event = one_event(app, || {
        traced(owner, "rq-release").post(
            &format!("{reservation}/release"),
            &json!({ "unitIds": ["u0", "u1"], "reason": "idle overnight" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.release", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u1"],
            "terminated": [], "skipped": [], "reason": "idle overnight",
            "clientRequestId": "rq-release",
        })
    );
    rid
}

/// Placing VMs, a dry run that appends nothing, a reclaim, stopping a VM.
fn vms_and_reclaims_are_audited(app: &App, actors: &Actors, rid: &str, reservation: &str) {
    let Actors {
        owner,
        owner_key,
        tenant,
        tenant_key,
        ..
    } = actors;
    let mut spot = String::new();
    let event = one_event(app, || {
        let reply = traced(tenant, "rq-spot").post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u0"], "tier": "spot" }),
        );
        spot = vm_id(&reply);
        reply
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": tenant_key, "actorOrgId": "tenant", "action": "vm.place", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "vmId": spot, "orgId": "tenant", "unitIds": ["u0"],
            "terminated": [], "skipped": [], "clientRequestId": "rq-spot",
        })
    );
    let mut community = String::new();
    one_event(app, || {
        let reply = tenant.post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u2"], "tier": "community" }),
        );
        community = vm_id(&reply);
        reply
    });

    no_event(app, "a dry run", || {
        owner
            .post(
                &format!("{reservation}/reclaim/dry-run"),
                &json!({ "unitIds": ["u0", "u2"], "reason": "what if" }),
            )
            .expect_status(200);
    });

    let event = one_event(app, || {
        traced(owner, "rq-reclaim").post(
            &format!("{reservation}/reclaim"),
            &json!({ "unitIds": ["u0", "u2"], "reason": "peak demand" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.reclaim", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": ["u0", "u2"],
            "terminated": [spot], "skipped": [community], "reason": "peak demand",
            "clientRequestId": "rq-reclaim",
        })
    );

    let event = one_event(app, || {
        traced(tenant, "rq-stop").delete(&format!("/v1/vms/{community}"))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": tenant_key, "actorOrgId": "tenant", "action": "vm.terminate", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "vmId": community, "orgId": "tenant", "unitIds": ["u2"],
            "terminated": [community], "skipped": [], "reason": "stopped", "clientRequestId": "rq-stop",
        })
    );
}

/// A topology change, a reaffirmation, a cancellation and a key revoked.
fn later_changes_are_audited(
    app: &App,
    actors: &Actors,
    rid: &str,
    reservation: &str,
    spare_id: &str,
) {
    let Actors {
        operator,
        owner,
        owner_key,
        ..
    } = actors;
    let event = one_event(app, || {
        traced(owner, "rq-topology").put(
            "/v1/nodes/n1",
            &json!({ "ownerOrgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4"] }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "node.update", "visibleTo": ["owner"], "vmOwners": [],
            "nodeId": "n1", "orgId": "owner", "unitIds": ["u0", "u1", "u2", "u3", "u4"],
            "terminated": [], "skipped": [rid], "clientRequestId": "rq-topology",
        })
    );

    let event = one_event(app, || {
        traced(operator, "rq-reaffirm").post(
            &format!("{reservation}/reaffirm"),
            &json!({ "reason": "units checked" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": "operator", "action": "reservation.reaffirm", "visibleTo": ["owner", "tenant"], "vmOwners": [], "nodeId": "n1",
            "reservationId": rid, "unitIds": ["u0", "u1", "u2", "u3"], "terminated": [],
            "skipped": [], "reason": "units checked", "clientRequestId": "rq-reaffirm",
        })
    );

    let event = one_event(app, || {
        traced(owner, "rq-cancel").post(
            &format!("{reservation}/cancel"),
            &json!({ "reason": "contract ended" }),
        )
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "reservation.cancel", "visibleTo": ["owner", "tenant"], "vmOwners": [],
            "nodeId": "n1", "reservationId": rid, "unitIds": [], "terminated": [],
            "skipped": [], "reason": "contract ended", "clientRequestId": "rq-cancel",
        })
    );

    let event = one_event(app, || {
        traced(owner, "rq-revoke").delete(&format!("/v1/orgs/owner/keys/{spare_id}"))
    });
    assert_eq!(
        content(&event),
        json!({
            "actorKeyId": owner_key, "actorOrgId": "owner", "action": "apikey.revoke", "visibleTo": ["owner"], "vmOwners": [],
            "orgId": "owner", "subjectId": spare_id,
            "unitIds": [], "terminated": [], "skipped": [], "clientRequestId": "rq-revoke",
        })
    );
}

/// Every action the trail knows has appeared, and the listing filters by each.
fn every_action_appeared_and_filters(operator: &Client) {
    let all = all_events(operator, "");
    let seen: BTreeSet<String> = actions(&all).into_iter().collect();
    let known = audit_actions();
    assert_eq!(known.len(), 12, "the contract's actions: {known:?}");
    for action in &known {
        assert!(seen.contains(action), "no {action} event");
        let filtered = all_events(operator, &format!("&action={action}"));
        assert!(!filtered.is_empty());
        assert!(filtered.iter().all(|e| e["action"] == action.as_str()));
    }
    assert_eq!(seen, known.into_iter().collect(), "unexpected actions");
}
