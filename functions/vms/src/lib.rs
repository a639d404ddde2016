//! VMs: place one under the market's placement rules, read, list, terminate.

use reservations_domain::ids::is_valid_id;
use reservations_domain::vm::{Tier, VmStatus};
use reservations_http::Incoming;
use reservations_http::auth::random_hex;
use reservations_http::request::{page_limit, single};
use reservations_http::{Call, Problem, Reply, render, routes, serve};
use reservations_store::vms::{NewVm, VmFilter};
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

fn place(call: &Call<'_>) -> Result<Reply, Problem> {
    let body: NewVmBody = call.json_body()?;
    let tier = Tier::parse(&body.tier)
        .ok_or_else(|| Problem::invalid("tier", "tier must be one of spot, community, verified"))?;
    if !is_valid_id(&body.node_id) {
        return Err(Problem::not_found("node not found"));
    }
    let id = format!("vm-{}", random_hex(8));
    call.answered(
        |vm| Reply::created(render::vm(vm, call.caller), format!("/v1/vms/{id}")),
        |ctx| {
            call.store.place_vm(
                ctx,
                NewVm {
                    id: &id,
                    node_id: &body.node_id,
                    unit_ids: &body.unit_ids,
                    tier,
                },
            )
        },
    )
}

fn get(call: &Call<'_>) -> Result<Reply, Problem> {
    let id = call.path_id("id", "VM")?;
    call.query(&[])?;
    let vm = call.store.read_vm(&call.context(), id)?;
    Ok(Reply::ok(render::vm(&vm, call.caller)))
}

fn list(call: &Call<'_>) -> Result<Reply, Problem> {
    let query = call.query(&["nodeId", "status", "cursor", "limit"])?;
    let status = single(&query, "status")?
        .map(|s| {
            VmStatus::parse(s).ok_or_else(|| {
                Problem::bad_request("invalid-parameter", "status must be running or terminated")
                    .with("parameter", "status")
            })
        })
        .transpose()?;
    let filter = VmFilter {
        node_id: single(&query, "nodeId")?.map(str::to_owned),
        status,
        after: single(&query, "cursor")?.map(str::to_owned),
        limit: page_limit(&query, 50, 500)?,
    };
    let page = call.store.list_vms(&call.context(), &filter)?;
    Ok(Reply::ok(render::page(&page, call.caller, |vm| {
        render::vm(vm, call.caller)
    })))
}

fn terminate(call: &Call<'_>) -> Result<Reply, Problem> {
    let id = call.path_id("id", "VM")?;
    call.answered(
        |vm| Reply::ok(render::vm(vm, call.caller)),
        |ctx| call.store.terminate_vm(ctx, id),
    )
}
