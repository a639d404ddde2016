//! Nodes: register one with its owner org and GPU units, update its units, read, list; and
//! the spot market, the units of every node that anyone may buy right now at tier=spot.

use reservations_domain::access::may_read_node;
use reservations_domain::market::{DEFAULT_PAGE, MAX_PAGE, may_read_market, parse_cursor};
use reservations_http::Incoming;
use reservations_http::request::{page_limit, single};
use reservations_http::{Call, Problem, Reply, render, routes, serve};
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("nodes"; authenticated: list_nodes, get_node, put_node, list_market),
        incoming,
    )
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
    let for_sale = call.store.units_for_sale(node_id, call.now)?;
    Ok(Reply::ok(render::node_with_sales(&node, for_sale)))
}

/// `GET /v1/market`: the units for sale, by node then unit id, each with the end of the
/// term it is sold within, and nothing else about the reservation.
fn list_market(call: &Call<'_>) -> Result<Reply, Problem> {
    may_read_market(call.caller).enforce("market", "reading the market needs node.read")?;
    let query = call.query(&["nodeId", "cursor", "limit"])?;
    let limit = page_limit(&query, DEFAULT_PAGE, MAX_PAGE)?;
    let node_id = single(&query, "nodeId")?;
    if let Some(node_id) = node_id
        && !reservations_domain::ids::is_valid_id(node_id)
    {
        return Err(
            Problem::bad_request("invalid-parameter", "nodeId must be a valid id")
                .with("parameter", "nodeId"),
        );
    }
    let after = match single(&query, "cursor")? {
        None => None,
        Some(cursor) => Some(parse_cursor(cursor).ok_or_else(|| {
            Problem::bad_request(
                "invalid-parameter",
                "cursor must be a nextCursor of this listing",
            )
            .with("parameter", "cursor")
        })?),
    };
    let page = call.store.market(node_id, after, limit, call.now)?;
    Ok(Reply::ok(render::page(&page, call.caller, render::offer)))
}

fn list_nodes(call: &Call<'_>) -> Result<Reply, Problem> {
    require_node_read(call)?;
    let query = call.query(&["ownerOrgId", "cursor", "limit"])?;
    let limit = page_limit(&query, 50, 500)?;
    let page = call.store.list_nodes(
        single(&query, "ownerOrgId")?,
        single(&query, "cursor")?,
        limit,
        call.now,
    )?;
    Ok(Reply::ok(render::page(
        &page,
        call.caller,
        render::listed_node,
    )))
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
    let for_sale = call.store.units_for_sale(node_id, call.now)?;
    let rendered = render::node_with_sales(&written.node, for_sale)
        .with_withheld_reservations(&written.withheld_reservation_ids);
    Ok(if written.created {
        Reply::created(rendered, format!("/v1/nodes/{node_id}"))
    } else {
        Reply::ok(rendered)
    })
}
