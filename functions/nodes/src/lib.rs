//! Nodes: register one with its owner org and GPU units, update its units, read, list; and
//! the spot market, the units of every node that anyone may buy right now at tier=spot.

use reservations_domain::ids::{Id, Node};
use reservations_domain::market::{DEFAULT_PAGE, MAX_PAGE, parse_cursor};
use reservations_http::Incoming;
use reservations_http::input::{Cursor, Json, Limit, NodeFilter, Path, Query};
use reservations_http::{Call, Operation, Problem, Reply, render, routes, serve};
use reservations_store::cursor::Listing;
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

fn get_node(call: &Call<'_>, Path(node_id): Path<Id<Node>>) -> Result<Reply, Problem> {
    let (node, for_sale) = call.store.capacity().read_node(&call.context(), &node_id)?;
    Ok(Reply::ok(render::node_with_sales(&node, for_sale)))
}

/// `GET /v1/market`: the units for sale, by node then unit id, each with the end of the
/// term it is sold within, and nothing else about the reservation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MarketListing {
    node_id: Option<NodeFilter>,
    cursor: Option<Cursor>,
    #[serde(default)]
    limit: Limit<DEFAULT_PAGE, MAX_PAGE>,
}

fn list_market(call: &Call<'_>, Query(query): Query<MarketListing>) -> Result<Reply, Problem> {
    let listing = Listing::market(call.caller);
    let key = query.cursor.map(|c| c.key_in(&listing)).transpose()?;
    let after = match &key {
        None => None,
        Some(key) => Some(parse_cursor(key).ok_or_else(|| {
            Problem::bad_request(
                "invalid-parameter",
                "cursor must be a nextCursor of this listing",
            )
            .with("parameter", "cursor")
        })?),
    };
    let node_id = query.node_id.as_ref().map(|filter| filter.0.as_str());
    let mut page = call
        .stores
        .read_market(&call.context(), node_id, after, query.limit.get())?;
    page.next_cursor = page.next_cursor.map(|key| listing.cursor_after_key(&key));
    Ok(Reply::ok(render::page(&page, call.caller, render::offer)))
}

/// `GET /v1/nodes`: the nodes, optionally of one owner.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeListing {
    owner_org_id: Option<String>,
    cursor: Option<Cursor>,
    #[serde(default)]
    limit: Limit<50, 500>,
}

fn list_nodes(call: &Call<'_>, Query(query): Query<NodeListing>) -> Result<Reply, Problem> {
    let listing = Listing::nodes(call.caller);
    let after = query.cursor.map(|c| c.key_in(&listing)).transpose()?;
    let mut page = call.stores.list_nodes(
        &call.context(),
        query.owner_org_id.as_deref(),
        after.as_deref(),
        query.limit.get(),
    )?;
    page.next_cursor = page.next_cursor.map(|key| listing.cursor_after_key(&key));
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

fn put_node(
    _: &Call<'_>,
    Path(node_id): Path<Id<Node>>,
    Json(body): Json<NodeBody>,
) -> Result<Operation, Problem> {
    Ok(Operation::PutNode {
        node_id,
        owner_org_id: body.owner_org_id,
        unit_ids: body.unit_ids,
    })
}
