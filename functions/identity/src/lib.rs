//! Identity and access: orgs, their API keys, and who the caller is.

use reservations_domain::access::{Role, permission_list};
use reservations_domain::ids::{ApiKey, Id, OperatorKey, Org};
use reservations_domain::values::Name;
use reservations_http::Incoming;
use reservations_http::auth::{issue_key, issue_operator_key, random_hex};
use reservations_http::input::not_null;
use reservations_http::input::{Cursor, FromPath, Json, Limit, Path, Query, id_in_path};
use reservations_http::routes::PathParams;
use reservations_http::{Call, Operation, Problem, Read, routes, serve};
use reservations_store::cursor::Listing;
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("identity"; authenticated:
            whoami, create_org, get_org, create_key, list_keys, revoke_key,
            create_operator_key, list_operator_keys, revoke_operator_key),
        incoming,
    )
}

fn whoami(_: &Call<'_>) -> Result<Read, Problem> {
    Ok(Read::Caller)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOrgBody {
    #[serde(default, deserialize_with = "not_null")]
    id: Option<String>,
    name: String,
}

fn create_org(_: &Call<'_>, Json(body): Json<NewOrgBody>) -> Result<Operation, Problem> {
    let name = Name::parse(body.name)?;
    let id = match body.id {
        Some(id) => Id::<Org>::parse(&id).ok_or_else(|| {
            Problem::invalid(
                "id",
                "id must be 1-128 characters: letters, digits, '.', '_', ':', '-', starting with a letter or digit",
            )
        })?,
        None => Id::parse(&format!("org-{}", random_hex(8))).expect("a generated id is valid"),
    };
    Ok(Operation::CreateOrg { id, name })
}

fn get_org(_: &Call<'_>, Path(org_id): Path<Id<Org>>) -> Result<Read, Problem> {
    Ok(Read::Org(org_id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKeyBody {
    name: String,
    role: String,
    #[serde(default, deserialize_with = "not_null")]
    permissions: Option<Vec<String>>,
}

fn create_key(
    _: &Call<'_>,
    Path(org_id): Path<Id<Org>>,
    Json(body): Json<NewKeyBody>,
) -> Result<Operation, Problem> {
    let name = Name::parse(body.name)?;
    let role: Role = body.role.parse().map_err(|()| {
        Problem::invalid(
            "role",
            "role must be one of admin, capacity-manager, member, viewer",
        )
    })?;
    let permissions = body
        .permissions
        .map(|names| permission_list(role, &names))
        .transpose()?;
    Ok(Operation::CreateKey {
        org_id,
        name,
        role,
        permissions,
        issued: issue_key(),
    })
}

/// `GET /v1/orgs/{orgId}/keys` and `GET /v1/operator/keys`: a page of keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyListing {
    cursor: Option<Cursor>,
    #[serde(default)]
    limit: Limit<50, 500>,
}

fn list_keys(
    call: &Call<'_>,
    Path(org_id): Path<Id<Org>>,
    Query(query): Query<KeyListing>,
) -> Result<Read, Problem> {
    let listing = Listing::org_keys(&org_id, call.caller);
    Ok(Read::OrgKeys {
        after: query
            .cursor
            .map(|cursor| cursor.position_in(&listing))
            .transpose()?,
        org_id,
        limit: query.limit.get(),
    })
}

/// `/v1/orgs/:orgId/keys/:keyId`: an org's API key.
struct KeyPath {
    org_id: Id<Org>,
    key_id: Id<ApiKey>,
}

impl FromPath for KeyPath {
    fn from_path(params: &PathParams) -> Result<Self, Problem> {
        Ok(KeyPath {
            org_id: id_in_path(params, "orgId")?,
            key_id: id_in_path(params, "keyId")?,
        })
    }
}

fn revoke_key(_: &Call<'_>, Path(key): Path<KeyPath>) -> Result<Operation, Problem> {
    Ok(Operation::RevokeKey {
        org_id: key.org_id,
        key_id: key.key_id,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOperatorKeyBody {
    name: String,
}

fn create_operator_key(
    _: &Call<'_>,
    Json(body): Json<NewOperatorKeyBody>,
) -> Result<Operation, Problem> {
    Ok(Operation::CreateOperatorKey {
        name: Name::parse(body.name)?,
        issued: issue_operator_key(),
    })
}

fn list_operator_keys(_: &Call<'_>, Query(query): Query<KeyListing>) -> Result<Read, Problem> {
    Ok(Read::OperatorKeys {
        after: query
            .cursor
            .map(|cursor| cursor.position_in(&Listing::operator_keys()))
            .transpose()?,
        limit: query.limit.get(),
    })
}

fn revoke_operator_key(
    _: &Call<'_>,
    Path(key_id): Path<Id<OperatorKey>>,
) -> Result<Operation, Problem> {
    Ok(Operation::RevokeOperatorKey(key_id))
}
