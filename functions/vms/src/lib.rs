//! VMs: place one under the market's placement rules, read, list, terminate.

use reservations_domain::ids::{Id, Node, Vm};
use reservations_domain::vm::{Tier, VmStatus};
use reservations_http::Incoming;
use reservations_http::input::{Cursor, Json, Limit, NoQuery, Path, Query};
use reservations_http::{Call, Operation, Problem, Read, routes, serve};
use reservations_store::cursor::Listing;
use reservations_store::vms::VmFilter;
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("vms"; authenticated: place, list, get, terminate),
        incoming,
    )
}

/// The placement body. There is no `id`: VM ids are generated here, so that a client can
/// neither confirm that another org uses an id (a clash would answer 409 where a free id
/// answers 201) nor need one to retry safely (that is what `Idempotency-Key` is for). An
/// `id` is refused like any other unknown field.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NewVmBody {
    node_id: String,
    unit_ids: Vec<String>,
    tier: String,
}

fn place(_: &Call<'_>, Json(body): Json<NewVmBody>) -> Result<Operation, Problem> {
    let tier = Tier::parse(&body.tier)
        .ok_or_else(|| Problem::invalid("tier", "tier must be one of spot, community, verified"))?;
    let node_id =
        Id::<Node>::parse(&body.node_id).ok_or_else(|| Problem::not_found("node not found"))?;
    Ok(Operation::PlaceVm {
        node_id,
        unit_ids: body.unit_ids,
        tier,
    })
}

fn get(_: &Call<'_>, Path(id): Path<Id<Vm>>, _: Query<NoQuery>) -> Result<Read, Problem> {
    Ok(Read::Vm(id))
}

/// `GET /v1/vms`: the VMs the caller may see, optionally of one node or status.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VmListing {
    node_id: Option<String>,
    status: Option<VmStatus>,
    cursor: Option<Cursor>,
    #[serde(default)]
    limit: Limit<50, 500>,
}

fn list(call: &Call<'_>, Query(query): Query<VmListing>) -> Result<Read, Problem> {
    let listing = Listing::vms(call.caller);
    let filter = VmFilter {
        node_id: query.node_id,
        status: query.status,
        after: query.cursor.map(|c| c.key_in(&listing)).transpose()?,
        limit: query.limit.get(),
    };
    Ok(Read::Vms { filter, listing })
}

fn terminate(_: &Call<'_>, Path(id): Path<Id<Vm>>) -> Result<Operation, Problem> {
    Ok(Operation::TerminateVm(id))
}
