//! Nodes: register one with its owner org and GPU units, update its units, read, list; and
//! the spot market, the units of every node that anyone may buy right now at tier=spot.

use reservations_domain::ids::{Id, Node};
use reservations_domain::market::{DEFAULT_PAGE, MAX_PAGE, parse_cursor};
use reservations_http::Incoming;
use reservations_http::input::{Cursor, Json, Limit, NodeFilter, Path, Query};
use reservations_http::{Call, Operation, Problem, Read, routes, serve};
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

fn get_node(_: &Call<'_>, Path(node_id): Path<Id<Node>>) -> Result<Read, Problem> {
    Ok(Read::Node(node_id))
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

fn list_market(call: &Call<'_>, Query(query): Query<MarketListing>) -> Result<Read, Problem> {
    let listing = Listing::market(call.caller);
    let after = match query.cursor.map(|c| c.key_in(&listing)).transpose()? {
        None => None,
        Some(key) => {
            let (node, unit) = parse_cursor(&key).ok_or_else(|| {
                Problem::bad_request(
                    "invalid-parameter",
                    "cursor must be a nextCursor of this listing",
                )
                .with("parameter", "cursor")
            })?;
            Some((node.to_owned(), unit.to_owned()))
        }
    };
    Ok(Read::Market {
        node_id: query.node_id.map(|filter| filter.0),
        after,
        limit: query.limit.get(),
        listing,
    })
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

fn list_nodes(call: &Call<'_>, Query(query): Query<NodeListing>) -> Result<Read, Problem> {
    let listing = Listing::nodes(call.caller);
    Ok(Read::Nodes {
        owner_org_id: query.owner_org_id,
        after: query.cursor.map(|c| c.key_in(&listing)).transpose()?,
        limit: query.limit.get(),
        listing,
    })
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
