//! Nodes: register one with its owner org and GPU units, update its units, read, list.

use reservations_domain::access::may_read_node;
use reservations_http::ReadRequest;
use reservations_http::call::{page_limit, single};
use reservations_http::{Call, Endpoint, Problem, Reply, dispatch, endpoint, render};
use serde::Deserialize;
use serde_json::{Value, json};
use spin_sdk::http::{Response, Router};
use spin_sdk::http_component;

#[http_component]
fn handle(ReadRequest(request): ReadRequest) -> Response {
    let mut router = Router::new();
    router.get("/v1/nodes", |r, p| {
        endpoint(r, p, Endpoint::READ, list_nodes)
    });
    router.get("/v1/nodes/:nodeId", |r, p| {
        endpoint(r, p, Endpoint::READ, get_node)
    });
    router.put("/v1/nodes/:nodeId", |r, p| {
        endpoint(r, p, Endpoint::LARGE_WRITE, put_node)
    });
    dispatch(&router, request)
}

fn require_node_read(call: &Call<'_>) -> Result<(), Problem> {
    Ok(may_read_node(call.caller).enforce("node", "reading nodes needs node.read")?)
}

fn get_node(call: &Call<'_>) -> Result<Reply, Problem> {
    let node_id = call.path_id("nodeId", "node")?;
    require_node_read(call)?;
    let node = call
        .store
        .get_node(node_id)?
        .ok_or_else(|| Problem::not_found("node not found"))?;
    Ok(Reply::ok(render::node(&node)))
}

fn list_nodes(call: &Call<'_>) -> Result<Reply, Problem> {
    require_node_read(call)?;
    let query = call.query(&["ownerOrgId", "cursor", "limit"])?;
    let limit = page_limit(&query, 50, 500)?;
    let page = call.store.list_nodes(
        single(&query, "ownerOrgId")?,
        single(&query, "cursor")?,
        limit,
    )?;
    Ok(Reply::ok(render::page(&page, |n| {
        Value::Object(render::node_summary(n))
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeBody {
    owner_org_id: String,
    unit_ids: Vec<String>,
}

fn put_node(call: &Call<'_>) -> Result<Reply, Problem> {
    let node_id = call.path_id("nodeId", "node")?;
    let body: NodeBody = call.json_body()?;
    let written =
        call.store
            .put_node(&call.context(), node_id, &body.owner_org_id, &body.unit_ids)?;
    let mut rendered = render::node(&written.node);
    rendered["withheldReservationIds"] = json!(written.withheld_reservation_ids);
    Ok(if written.created {
        Reply::created(rendered, format!("/v1/nodes/{node_id}"))
    } else {
        Reply::ok(rendered)
    })
}
