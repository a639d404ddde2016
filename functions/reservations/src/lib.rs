//! Reservations on a node: create, read, list (status filter, cursor), cancel, re-affirm.

use reservations_domain::ids::{Id, Node};
use reservations_domain::reservation::{NewReservation, Status, Term};
use reservations_domain::values::{ContractRef, Reason, instant};
use reservations_http::Incoming;
use reservations_http::auth::random_hex;
use reservations_http::input::not_null;
use reservations_http::input::{
    Cursor, FromText, Json, JsonOrDefault, Limit, NoQuery, Path, Query, ReservationPath,
};
use reservations_http::{Call, Operation, Problem, Read, routes, serve};
use reservations_store::cursor::Listing;
use reservations_store::reservations::ReservationFilter;
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("reservations"; authenticated: create, list, get, cancel, reaffirm),
        incoming,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NewReservationBody {
    reserved_unit_ids: Vec<String>,
    allowed_org_ids: Vec<String>,
    #[serde(default)]
    managing_org_ids: Vec<String>,
    starts_at: String,
    #[serde(default, deserialize_with = "not_null")]
    ends_at: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    contract_ref: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    reason: Option<String>,
}

fn create(
    _: &Call<'_>,
    Path(node_id): Path<Id<Node>>,
    Json(body): Json<NewReservationBody>,
) -> Result<Operation, Problem> {
    let reason = Reason::optional(body.reason)?;
    let contract_ref = body.contract_ref.map(ContractRef::parse).transpose()?;
    let request = NewReservation {
        reserved_unit_ids: body.reserved_unit_ids,
        allowed_org_ids: body.allowed_org_ids,
        managing_org_ids: body.managing_org_ids,
        term: Term {
            starts_at: instant("startsAt", &body.starts_at)?,
            ends_at: body
                .ends_at
                .as_deref()
                .map(|t| instant("endsAt", t))
                .transpose()?,
        },
        contract_ref: contract_ref.map(ContractRef::into_string),
        reason: reason.map(Reason::into_string),
    };
    Ok(Operation::CreateReservation {
        node_id,
        id: format!("rsv-{}", random_hex(8)),
        request,
    })
}

fn get(
    _: &Call<'_>,
    Path(path): Path<ReservationPath>,
    _: Query<NoQuery>,
) -> Result<Read, Problem> {
    Ok(Read::Reservation(path))
}

/// `GET /v1/nodes/{nodeId}/reservations`: the node's reservations the caller may see,
/// optionally of some statuses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservationListing {
    #[serde(default)]
    status: Vec<Statuses>,
    cursor: Option<Cursor>,
    #[serde(default)]
    limit: Limit<20, 100>,
}

/// One `status` parameter: several statuses, comma-separated. The parameter may also be
/// repeated (`?status=active&status=pending`, as clients generated from the OpenAPI document
/// send a list).
struct Statuses(Vec<Status>);

impl FromText for Statuses {
    fn from_text(text: &str) -> Result<Self, String> {
        text.split(',')
            .map(|s| {
                Status::parse(s.trim()).ok_or_else(|| {
                    format!("unknown status {s:?}; use pending, active, expired, cancelled, needs-review")
                })
            })
            .collect::<Result<_, _>>()
            .map(Statuses)
    }
}

reservations_http::deserialize_from_text!(Statuses);

fn list(
    call: &Call<'_>,
    Path(node_id): Path<Id<Node>>,
    Query(query): Query<ReservationListing>,
) -> Result<Read, Problem> {
    let listing = Listing::reservations(&node_id, call.caller);
    let filter = ReservationFilter {
        statuses: query.status.into_iter().flat_map(|s| s.0).collect(),
        after: query
            .cursor
            .map(|cursor| cursor.position_in(&listing))
            .transpose()?,
        limit: query.limit.get(),
    };
    Ok(Read::Reservations { node_id, filter })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    #[serde(default, deserialize_with = "not_null")]
    reason: Option<String>,
}

fn cancel(
    _: &Call<'_>,
    Path(at): Path<ReservationPath>,
    JsonOrDefault(body): JsonOrDefault<CancelBody>,
) -> Result<Operation, Problem> {
    Ok(Operation::CancelReservation {
        at,
        reason: Reason::optional(body.reason)?,
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReaffirmBody {
    #[serde(default, deserialize_with = "not_null")]
    reserved_unit_ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "not_null")]
    reason: Option<String>,
}

fn reaffirm(
    _: &Call<'_>,
    Path(at): Path<ReservationPath>,
    JsonOrDefault(body): JsonOrDefault<ReaffirmBody>,
) -> Result<Operation, Problem> {
    Ok(Operation::ReaffirmReservation {
        at,
        unit_ids: body.reserved_unit_ids,
        reason: Reason::optional(body.reason)?,
    })
}
