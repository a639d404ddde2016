//! VMs: place one under the market's placement rules, read, list, terminate.

use reservations_domain::ids::{Id, Node, Vm};
use reservations_domain::vm::{Tier, VmStatus};
use reservations_http::Incoming;
use reservations_http::input::{Cursor, Json, Limit, NoQuery, Path, Query};
use reservations_http::{Call, Operation, Problem, Reply, render, routes, serve};
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

fn get(call: &Call<'_>, Path(id): Path<Id<Vm>>, _: Query<NoQuery>) -> Result<Reply, Problem> {
    let vm = call.stores.read_vm(&call.context(), &id)?;
    Ok(Reply::ok(render::vm(&vm, call.caller)))
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

fn list(call: &Call<'_>, Query(query): Query<VmListing>) -> Result<Reply, Problem> {
    let listing = Listing::vms(call.caller);
    let filter = VmFilter {
        node_id: query.node_id,
        status: query.status,
        after: query.cursor.map(|c| c.key_in(&listing)).transpose()?,
        limit: query.limit.get(),
    };
    let mut page = call.stores.list_vms(&call.context(), &filter)?;
    page.next_cursor = page.next_cursor.map(|key| listing.cursor_after_key(&key));
    Ok(Reply::ok(render::page(&page, call.caller, |vm| {
        render::vm(vm, call.caller)
    })))
}

fn terminate(_: &Call<'_>, Path(id): Path<Id<Vm>>) -> Result<Operation, Problem> {
    Ok(Operation::TerminateVm(id))
}
