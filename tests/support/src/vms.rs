//! Placing VMs, the request most suites make.

use api_client::{Client, Reply};
use serde_json::json;

/// Asks to place a VM of `tier` on `units` of `node`.
pub fn place_vm(client: &Client, node: &str, units: &[&str], tier: &str) -> Reply {
    client.post(
        "/v1/vms",
        &json!({ "nodeId": node, "unitIds": units, "tier": tier }),
    )
}

/// Places a VM that the rules allow; returns its id (the server's to choose).
#[track_caller]
pub fn placed_vm(client: &Client, node: &str, units: &[&str], tier: &str) -> String {
    let vm = place_vm(client, node, units, tier)
        .expect_status(201)
        .json();
    vm["id"].as_str().expect("id").to_owned()
}
