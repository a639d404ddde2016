//! API keys: an org's keys and the platform operators' keys, stored in two tables that share
//! their shape (an operator key is a key without org, role or permission list) and written,
//! read, listed and revoked by one code path. Only a hash of a key's secret is ever stored.

use std::collections::BTreeSet;

use reservations_domain::access::{
    Permission, Role, effective_permissions, may_issue_key, may_manage_keys,
    may_manage_operator_keys, may_revoke_key,
};
use reservations_domain::{DomainError, Timestamp};

use reservations_domain::time::from_millis;

use crate::audit::{Basis, NewEvent, basis_column, read_basis};
use crate::cursor::{Listing, Position};
use crate::storage::{Row, exec, first_row, millis, read_listed, rows, text};
use crate::storage::{SqlValue, StorageError};
use crate::write::Fact;
use crate::write::{ApiKeyRow, Changes, OperatorKeyRow, PLATFORM_CHAIN, Planned, Write};
use crate::{Context, Identity, Page, Result};

const OPERATORS_ONLY: &str = "only platform operators manage operator keys";

/// How many live (unrevoked) API keys one org may hold: each key may hold places of the
/// shared feed and other bounded resources, so one org cannot mint keys to crowd out the rest
/// (docs/api.md, "The events feed").
pub const LIVE_KEYS_PER_ORG: usize = 50;

/// A key of an org.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub role: Role,
    /// The explicit, narrower permission list, if the key has one.
    pub permissions: Option<Vec<Permission>>,
    pub created_at: Timestamp,
    pub created_by: String,
    pub revoked_at: Option<Timestamp>,
}

impl ApiKey {
    pub fn effective_permissions(&self) -> BTreeSet<Permission> {
        effective_permissions(self.role, self.permissions.as_deref())
    }
}

/// A key of a platform operator: above all orgs, holding every permission.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorKey {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
    pub created_by: String,
    pub revoked_at: Option<Timestamp>,
}

/// An org key to create: the caller generated its id and secret and passes only the secret's
/// hash.
pub struct NewApiKey<'a> {
    pub id: &'a str,
    pub org_id: &'a str,
    pub name: &'a str,
    pub role: Role,
    pub permissions: Option<&'a [Permission]>,
    pub secret_hash: &'a str,
}

/// What differs between the two kinds of key: where they are stored and what an org key
/// adds to the columns both share.
trait StoredKey: Sized {
    const TABLE: &'static str;
    /// The name refusals give the key.
    const WHAT: &'static str;
    /// Columns beyond `id, name, created_at, created_by, revoked_at, secret_hash`.
    const OWN_COLUMNS: &'static [&'static str];
    fn from_row(row: &Row<'_>) -> Result<Self, StorageError>;
    fn id(&self) -> &str;
    /// The org the key belongs to: the one its audit events are shown to.
    fn org_id(&self) -> Option<&str>;
    fn revoked_at(&self) -> Option<Timestamp>;
    fn revoked(self, at: Timestamp) -> Self;
}

impl StoredKey for ApiKey {
    const TABLE: &'static str = "api_keys";
    const WHAT: &'static str = "API key";
    const OWN_COLUMNS: &'static [&'static str] = &["org_id", "role", "permissions"];

    fn from_row(row: &Row<'_>) -> Result<Self, StorageError> {
        let permissions = row
            .opt_json::<Vec<String>>("permissions")?
            .map(|names| {
                names
                    .iter()
                    .map(|name| {
                        name.parse().map_err(|()| {
                            StorageError::Other(
                                format!("column permissions: unknown permission {name:?}").into(),
                            )
                        })
                    })
                    .collect::<Result<Vec<Permission>, _>>()
            })
            .transpose()?;
        Ok(ApiKey {
            id: row.text("id")?,
            org_id: row.text("org_id")?,
            name: row.text("name")?,
            role: row.parsed("role", "role", |name| name.parse().ok())?,
            permissions,
            created_at: row.time("created_at")?,
            created_by: row.text("created_by")?,
            revoked_at: row.opt_time("revoked_at")?,
        })
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn org_id(&self) -> Option<&str> {
        Some(&self.org_id)
    }

    fn revoked_at(&self) -> Option<Timestamp> {
        self.revoked_at
    }

    fn revoked(self, at: Timestamp) -> Self {
        ApiKey {
            revoked_at: Some(at),
            ..self
        }
    }
}

impl StoredKey for OperatorKey {
    const TABLE: &'static str = "operator_keys";
    const WHAT: &'static str = "operator key";
    const OWN_COLUMNS: &'static [&'static str] = &[];

    fn from_row(row: &Row<'_>) -> Result<Self, StorageError> {
        Ok(OperatorKey {
            id: row.text("id")?,
            name: row.text("name")?,
            created_at: row.time("created_at")?,
            created_by: row.text("created_by")?,
            revoked_at: row.opt_time("revoked_at")?,
        })
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn org_id(&self) -> Option<&str> {
        None
    }

    fn revoked_at(&self) -> Option<Timestamp> {
        self.revoked_at
    }

    fn revoked(self, at: Timestamp) -> Self {
        OperatorKey {
            revoked_at: Some(at),
            ..self
        }
    }
}

const SHARED_COLUMNS: [&str; 6] = [
    "id",
    "name",
    "created_at",
    "created_by",
    "revoked_at",
    "secret_hash",
];

fn columns<K: StoredKey>() -> String {
    SHARED_COLUMNS
        .iter()
        .chain(K::OWN_COLUMNS)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// The orgs that see a key's events: its own, if it has one.
/// The write of a key's creation or revocation, on the platform chain; the key's org sees
/// the event.
fn key_write(
    key_id: &str,
    org_id: Option<&str>,
    action: &'static str,
    basis: Basis,
    changes: Changes,
) -> Write {
    let event = NewEvent {
        action,
        org_id: org_id.map(str::to_owned),
        visible_to: org_id.map(str::to_owned).into_iter().collect(),
        subject_id: Some(key_id.to_owned()),
        ..NewEvent::default()
    };
    Write::new(PLATFORM_CHAIN.to_owned(), basis, event, changes)
}

impl Identity<'_, '_> {
    /// Stores a new key of an org, if the caller manages the org's keys and holds every
    /// permission the new key would.
    pub fn create_key(&self, ctx: &Context<'_>, key: NewApiKey<'_>) -> Result<ApiKey> {
        self.carry_out(ctx, || self.plan_create_key(ctx, &key))
    }

    /// The plan of [`Identity::create_key`] from fresh facts.
    pub fn plan_create_key(
        &self,
        ctx: &Context<'_>,
        key: &NewApiKey<'_>,
    ) -> Result<Planned<ApiKey>> {
        may_manage_keys(ctx.caller, key.org_id)
            .enforce("org", "managing API keys needs apikey.manage")?;
        may_issue_key(
            ctx.caller,
            key.org_id,
            &effective_permissions(key.role, key.permissions),
        )
        .enforce(
            "org",
            "a key cannot create a key holding permissions it does not hold itself",
        )?;
        let permissions: Option<Vec<String>> = key
            .permissions
            .map(|list| list.iter().map(|p| p.as_str().to_owned()).collect());
        let (live_keys, basis) = self.org_keys_facts(key.org_id)?;
        let Some(live_keys) = live_keys else {
            return Err(DomainError::NotFound { what: "org" }.into());
        };
        if live_keys >= LIVE_KEYS_PER_ORG {
            return Err(DomainError::TooManyKeys {
                limit: LIVE_KEYS_PER_ORG,
            }
            .into());
        }
        let created = ApiKey {
            id: key.id.to_owned(),
            org_id: key.org_id.to_owned(),
            name: key.name.to_owned(),
            role: key.role,
            permissions: key.permissions.map(<[Permission]>::to_vec),
            created_at: from_millis(ctx.now.timestamp_millis()),
            created_by: ctx.caller.key_id.clone(),
            revoked_at: None,
        };
        let changes = Changes {
            api_keys: vec![ApiKeyRow {
                id: key.id.to_owned(),
                org_id: key.org_id.to_owned(),
                name: key.name.to_owned(),
                role: key.role.as_str().to_owned(),
                permissions: permissions
                    .as_ref()
                    .map(|list| serde_json::to_string(list).expect("names serialize")),
                secret_hash: key.secret_hash.to_owned(),
            }],
            ..Changes::default()
        };
        Ok(Planned::new(
            created,
            key_write(key.id, Some(key.org_id), "apikey.create", basis, changes),
        ))
    }

    pub fn create_operator_key(
        &self,
        ctx: &Context<'_>,
        id: &str,
        name: &str,
        secret_hash: &str,
    ) -> Result<OperatorKey> {
        self.carry_out(ctx, || {
            self.plan_create_operator_key(ctx, id, name, secret_hash)
        })
    }

    /// The plan of [`Identity::create_operator_key`] from fresh facts.
    pub fn plan_create_operator_key(
        &self,
        ctx: &Context<'_>,
        id: &str,
        name: &str,
        secret_hash: &str,
    ) -> Result<Planned<OperatorKey>> {
        may_manage_operator_keys(ctx.caller).enforce("operator key", OPERATORS_ONLY)?;
        let (_, basis) = self.platform_facts("operator_keys", id)?;
        let created = OperatorKey {
            id: id.to_owned(),
            name: name.to_owned(),
            created_at: from_millis(ctx.now.timestamp_millis()),
            created_by: ctx.caller.key_id.clone(),
            revoked_at: None,
        };
        let changes = Changes {
            operator_keys: vec![OperatorKeyRow {
                id: id.to_owned(),
                name: name.to_owned(),
                secret_hash: secret_hash.to_owned(),
            }],
            ..Changes::default()
        };
        Ok(Planned::new(
            created,
            key_write(id, None, "apikey.create", basis, changes),
        ))
    }

    /// Whether `table` has a row `id`, and the platform chain's head, in one statement.
    /// How many live keys the org holds (`None`: no such org), and the basis of a write
    /// that depends on it: the org, and its set of live keys (`['org-keys', org]`, moved
    /// whenever one of its keys is created or revoked).
    fn org_keys_facts(&self, org_id: &str) -> Result<(Option<usize>, Basis)> {
        let read = format!(
            "SELECT {} AS fact UNION ALL SELECT {}",
            Fact::org("?1"),
            Fact::org_keys("?1")
        );
        let result = exec(
            self.db(),
            &format!(
                "SELECT (SELECT 1 FROM orgs WHERE id = ?1) AS found, \
                 (SELECT COUNT(*) FROM api_keys WHERE org_id = ?1 AND revoked_at IS NULL) \
                 AS live_keys, {}",
                basis_column("?2", &read)
            ),
            &[text(org_id), text(PLATFORM_CHAIN)],
        )?;
        let row = first_row(&result)
            .ok_or_else(|| StorageError::Other("the org's keys returned no row".into()))?;
        let live_keys = match row.value("found")? {
            SqlValue::Null => None,
            _ => Some(row.int("live_keys")? as usize),
        };
        Ok((live_keys, read_basis(&row)?))
    }

    pub(crate) fn platform_facts(&self, table: &str, id: &str) -> Result<(bool, Basis)> {
        let fact = match table {
            "orgs" => Fact::org("?1"),
            _ => Fact::key("?1"),
        };
        let result = exec(
            self.db(),
            &format!(
                "SELECT (SELECT 1 FROM {table} WHERE id = ?1) AS found, {}",
                basis_column("?2", &format!("SELECT {fact} AS fact"))
            ),
            &[text(id), text(PLATFORM_CHAIN)],
        )?;
        let row = first_row(&result)
            .ok_or_else(|| StorageError::Other("the platform's facts returned no row".into()))?;
        Ok((
            !matches!(row.value("found")?, SqlValue::Null),
            read_basis(&row)?,
        ))
    }

    /// A page of an org's keys, for a caller who manages them; `after` is where a cursor of
    /// [`Listing::org_keys`] stands.
    pub fn list_keys(
        &self,
        ctx: &Context<'_>,
        org_id: &str,
        after: Option<&Position>,
        limit: usize,
    ) -> Result<Page<ApiKey>> {
        may_manage_keys(ctx.caller, org_id)
            .enforce("org", "listing API keys needs apikey.manage")?;
        if self.get_org(org_id)?.is_none() {
            return Err(DomainError::NotFound { what: "org" }.into());
        }
        let listing = Listing::org_keys(org_id, ctx.caller);
        self.list_stored_keys(Some(org_id), &listing, after, limit)
    }

    /// Operator keys, oldest first; `after` is where a cursor of [`Listing::operator_keys`]
    /// stands.
    pub fn list_operator_keys(
        &self,
        ctx: &Context<'_>,
        after: Option<&Position>,
        limit: usize,
    ) -> Result<Page<OperatorKey>> {
        may_manage_operator_keys(ctx.caller).enforce("operator key", OPERATORS_ONLY)?;
        self.list_stored_keys(None, &Listing::operator_keys(), after, limit)
    }

    /// Keys of one org (or, for operator keys, `None`), oldest first.
    fn list_stored_keys<K: StoredKey>(
        &self,
        org_id: Option<&str>,
        listing: &Listing,
        after: Option<&Position>,
        limit: usize,
    ) -> Result<Page<K>> {
        let limit = limit.clamp(1, 500);
        let mut conditions = Vec::new();
        let mut params = Vec::new();
        if let Some(org_id) = org_id {
            conditions.push("org_id = ?".to_owned());
            params.push(text(org_id));
        }
        if let Some(after) = after {
            conditions.push("(created_at, id) > (?, ?)".to_owned());
            params.push(after.created_at.clone());
            params.push(after.id.clone());
        }
        params.push(SqlValue::Integer(limit as i64 + 1));
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        let result = exec(
            self.db(),
            &format!(
                "SELECT {} FROM {} {filter} ORDER BY created_at, id LIMIT ?",
                columns::<K>(),
                K::TABLE
            ),
            &params,
        )?;
        let listed = rows(&result)
            .map(|row| read_listed(&row, "id", |row| K::from_row(row)))
            .collect();
        let mut page = Page::from_overfetched_rows(listed, limit, |key: &K| key.id().to_owned());
        if page.next_cursor.is_some() {
            let last = rows(&result).nth(limit - 1).expect("the page's last row");
            page.next_cursor = Some(listing.cursor(&Position::of_row(&last)?));
        }
        Ok(page)
    }

    /// Revokes a key of an org; takes effect on the next request. Revoking a revoked key
    /// changes nothing.
    pub fn revoke_key(&self, ctx: &Context<'_>, org_id: &str, key_id: &str) -> Result<ApiKey> {
        self.carry_out(ctx, || self.plan_revoke_key(ctx, org_id, key_id))
    }

    /// The plan of [`Identity::revoke_key`] from fresh facts.
    pub fn plan_revoke_key(
        &self,
        ctx: &Context<'_>,
        org_id: &str,
        key_id: &str,
    ) -> Result<Planned<ApiKey>> {
        self.plan_revocation(ctx, key_id, api_key_revocation(ctx, org_id)?)
    }

    /// Revokes an operator key; takes effect on the next request. Revoking a revoked key
    /// changes nothing.
    pub fn revoke_operator_key(&self, ctx: &Context<'_>, key_id: &str) -> Result<OperatorKey> {
        self.carry_out(ctx, || self.plan_revoke_operator_key(ctx, key_id))
    }

    /// The plan of [`Identity::revoke_operator_key`] from fresh facts.
    pub fn plan_revoke_operator_key(
        &self,
        ctx: &Context<'_>,
        key_id: &str,
    ) -> Result<Planned<OperatorKey>> {
        self.plan_revocation(ctx, key_id, operator_key_revocation(ctx)?)
    }

    /// Whether the caller may revoke the key `key_id` (of the org `org_id`, or an operator
    /// key), asked before anything is written: refused as [`Identity::revoke_key`] and
    /// [`Identity::revoke_operator_key`] would refuse it.
    pub fn check_revocation(
        &self,
        ctx: &Context<'_>,
        org_id: Option<&str>,
        key_id: &str,
    ) -> Result<()> {
        match org_id {
            Some(org_id) => self
                .revocable_key(key_id, api_key_revocation(ctx, org_id)?)
                .map(drop),
            None => self
                .revocable_key(key_id, operator_key_revocation(ctx)?)
                .map(drop),
        }
    }

    /// Keeps, in this cell, that the key `key_id` was revoked at `at`, so that the cell's
    /// write statement refuses it (docs/design.md, "Cells"). Once is enough.
    pub fn hold_revocation(&self, key_id: &str, at: Timestamp) -> Result<()> {
        exec(
            self.db(),
            "INSERT OR IGNORE INTO revoked_keys (id, revoked_at) VALUES (?1, ?2)",
            &[text(key_id), millis(at)],
        )?;
        Ok(())
    }

    /// The key `key_id` with what a write revoking it is made on, once `may_revoke` allows
    /// it.
    fn revocable_key<K: StoredKey>(
        &self,
        key_id: &str,
        may_revoke: impl Fn(&K) -> Result<()>,
    ) -> Result<(K, Basis)> {
        let result = exec(
            self.db(),
            &format!(
                "SELECT {}, {} FROM {} WHERE id = ?1",
                columns::<K>(),
                basis_column("?2", &format!("SELECT {} AS fact", Fact::key("?1"))),
                K::TABLE
            ),
            &[text(key_id), text(PLATFORM_CHAIN)],
        )?;
        let row = first_row(&result).ok_or(DomainError::NotFound { what: K::WHAT })?;
        let key = K::from_row(&row)?;
        may_revoke(&key)?;
        Ok((key, read_basis(&row)?))
    }

    /// The revocation of a key once `may_revoke` allows it, with its audit event.
    fn plan_revocation<K: StoredKey>(
        &self,
        ctx: &Context<'_>,
        key_id: &str,
        may_revoke: impl Fn(&K) -> Result<()>,
    ) -> Result<Planned<K>> {
        let (key, basis) = self.revocable_key(key_id, &may_revoke)?;
        // Revoked before: nothing changes.
        if key.revoked_at().is_some() {
            return Ok(Planned {
                outcome: key,
                write: None,
            });
        }
        let changes = match key.org_id() {
            Some(_) => Changes {
                revoked_api_keys: vec![key_id.to_owned()],
                ..Changes::default()
            },
            None => Changes {
                revoked_operator_keys: vec![key_id.to_owned()],
                ..Changes::default()
            },
        };
        let write = key_write(key_id, key.org_id(), "apikey.revoke", basis, changes);
        Ok(Planned::new(
            key.revoked(from_millis(ctx.now.timestamp_millis())),
            write,
        ))
    }

    /// An org key and the hash of its secret, for authentication.
    pub fn key_with_secret_hash(&self, key_id: &str) -> Result<Option<(ApiKey, String)>> {
        self.stored_key_with_secret_hash(key_id)
    }

    /// An operator key and the hash of its secret, for authentication.
    pub fn operator_key_with_secret_hash(
        &self,
        key_id: &str,
    ) -> Result<Option<(OperatorKey, String)>> {
        self.stored_key_with_secret_hash(key_id)
    }

    fn stored_key_with_secret_hash<K: StoredKey>(
        &self,
        key_id: &str,
    ) -> Result<Option<(K, String)>> {
        let result = exec(
            self.db(),
            &format!("SELECT {} FROM {} WHERE id = ?", columns::<K>(), K::TABLE),
            &[text(key_id)],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        Ok(Some((K::from_row(&row)?, row.text("secret_hash")?)))
    }
}

/// What a caller must be allowed to revoke a key of `org_id`: the key must be the org's,
/// and hold no permission the caller does not.
fn api_key_revocation<'c>(
    ctx: &'c Context<'_>,
    org_id: &'c str,
) -> Result<impl Fn(&ApiKey) -> Result<()> + 'c> {
    may_manage_keys(ctx.caller, org_id).enforce("org", "revoking API keys needs apikey.manage")?;
    Ok(move |key: &ApiKey| {
        if key.org_id != org_id {
            return Err(DomainError::NotFound { what: ApiKey::WHAT }.into());
        }
        Ok(
            may_revoke_key(ctx.caller, org_id, &key.effective_permissions()).enforce(
                ApiKey::WHAT,
                "a key cannot revoke a key holding permissions it does not hold itself",
            )?,
        )
    })
}

/// What a caller must be allowed to revoke an operator key: to be an operator.
fn operator_key_revocation(ctx: &Context<'_>) -> Result<impl Fn(&OperatorKey) -> Result<()>> {
    may_manage_operator_keys(ctx.caller).enforce("operator key", OPERATORS_ONLY)?;
    Ok(|_: &OperatorKey| Ok(()))
}
