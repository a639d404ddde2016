//! Orgs and their API keys. Only a hash of a key's secret is ever stored.

use std::collections::BTreeSet;

use reservations_domain::access::{Permission, Role, effective_permissions, may_revoke_key};
use reservations_domain::storage::{SqlValue, StorageError};
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::rows::{Row, exec, for_chunks, millis, placeholders, rows};
use crate::schema::text;
use crate::tx::in_write_transaction;
use crate::{Context, Page, Result, Store};

#[derive(Debug, Clone, PartialEq)]
pub struct Org {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
}

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

/// A key to create: the caller generated its id and secret and passes only the secret's hash.
pub struct NewApiKey<'a> {
    pub id: &'a str,
    pub org_id: &'a str,
    pub name: &'a str,
    pub role: Role,
    pub permissions: Option<&'a [Permission]>,
    pub secret_hash: &'a str,
}

const KEY_COLUMNS: &str =
    "id, org_id, name, role, permissions, created_at, created_by, revoked_at, secret_hash";

fn read_key(row: &Row<'_>) -> Result<ApiKey, StorageError> {
    let role_name = row.text(3)?;
    let role = role_name
        .parse()
        .map_err(|()| StorageError::Other(format!("unknown role {role_name:?}")))?;
    let permissions = row
        .opt_string_list(4)?
        .map(|names| {
            names
                .iter()
                .map(|n| {
                    n.parse()
                        .map_err(|()| StorageError::Other(format!("unknown permission {n:?}")))
                })
                .collect::<Result<Vec<Permission>, _>>()
        })
        .transpose()?;
    Ok(ApiKey {
        id: row.text(0)?,
        org_id: row.text(1)?,
        name: row.text(2)?,
        role,
        permissions,
        created_at: row.time(5)?,
        created_by: row.text(6)?,
        revoked_at: row.opt_time(7)?,
    })
}

impl Store<'_> {
    pub fn create_org(&self, ctx: &Context<'_>, id: &str, name: &str) -> Result<Org> {
        in_write_transaction(self.db(), || {
            if self.get_org(id)?.is_some() {
                return Err(DomainError::AlreadyExists {
                    what: "org",
                    id: id.to_owned(),
                }
                .into());
            }
            exec(
                self.db(),
                "INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)",
                &[text(id), text(name), millis(ctx.now)],
            )?;
            self.append_event(
                ctx,
                NewEvent {
                    action: "org.create",
                    org_id: Some(id),
                    visible_to: vec![id.to_owned()],
                    ..NewEvent::default()
                },
            )?;
            Ok(Org {
                id: id.to_owned(),
                name: name.to_owned(),
                created_at: ctx.now,
            })
        })
    }

    pub fn get_org(&self, id: &str) -> Result<Option<Org>> {
        let result = exec(
            self.db(),
            "SELECT id, name, created_at FROM orgs WHERE id = ?",
            &[text(id)],
        )?;
        let Some(row) = rows(&result).next() else {
            return Ok(None);
        };
        Ok(Some(Org {
            id: row.text(0)?,
            name: row.text(1)?,
            created_at: row.time(2)?,
        }))
    }

    /// Which of `ids` name existing orgs.
    pub fn existing_org_ids(&self, ids: &[String]) -> Result<BTreeSet<String>> {
        let mut found = BTreeSet::new();
        for_chunks(ids, 1, |part| {
            let result = exec(
                self.db(),
                &format!(
                    "SELECT id FROM orgs WHERE id IN ({})",
                    placeholders(part.len())
                ),
                &part.iter().map(|id| text(id)).collect::<Vec<_>>(),
            )?;
            for row in rows(&result) {
                found.insert(row.text(0)?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    pub fn create_key(&self, ctx: &Context<'_>, key: NewApiKey<'_>) -> Result<ApiKey> {
        in_write_transaction(self.db(), || {
            if self.get_org(key.org_id)?.is_none() {
                return Err(DomainError::NotFound { what: "org" }.into());
            }
            let permissions: Option<Vec<String>> = key
                .permissions
                .map(|list| list.iter().map(|p| p.as_str().to_owned()).collect());
            exec(
                self.db(),
                &format!(
                    "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)"
                ),
                &[
                    text(key.id),
                    text(key.org_id),
                    text(key.name),
                    text(key.role.as_str()),
                    permissions
                        .as_deref()
                        .map_or(SqlValue::Null, crate::rows::json_list),
                    millis(ctx.now),
                    text(&ctx.caller.key_id),
                    text(key.secret_hash),
                ],
            )?;
            self.append_event(
                ctx,
                NewEvent {
                    action: "apikey.create",
                    org_id: Some(key.org_id),
                    visible_to: vec![key.org_id.to_owned()],
                    subject_id: Some(key.id),
                    ..NewEvent::default()
                },
            )?;
            Ok(ApiKey {
                id: key.id.to_owned(),
                org_id: key.org_id.to_owned(),
                name: key.name.to_owned(),
                role: key.role,
                permissions: key.permissions.map(<[Permission]>::to_vec),
                created_at: ctx.now,
                created_by: ctx.caller.key_id.clone(),
                revoked_at: None,
            })
        })
    }

    /// An org's keys, oldest first; the cursor is the last key id of the previous page.
    pub fn list_keys(
        &self,
        org_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ApiKey>> {
        let limit = limit.clamp(1, 500);
        let result = match after {
            None => exec(
                self.db(),
                &format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE org_id = ? ORDER BY created_at, id LIMIT ?"
                ),
                &[text(org_id), SqlValue::Integer(limit as i64 + 1)],
            )?,
            Some(after) => exec(
                self.db(),
                &format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys k WHERE org_id = ?1 AND (created_at, id) > \
                     (SELECT created_at, id FROM api_keys WHERE id = ?2) ORDER BY created_at, id LIMIT ?3"
                ),
                &[
                    text(org_id),
                    text(after),
                    SqlValue::Integer(limit as i64 + 1),
                ],
            )?,
        };
        let items = rows(&result)
            .map(|row| read_key(&row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_overfetched(items, limit, |k| k.id.clone()))
    }

    /// Revokes a key; takes effect on the next request. Revoking a revoked key changes nothing.
    pub fn revoke_key(&self, ctx: &Context<'_>, org_id: &str, key_id: &str) -> Result<ApiKey> {
        in_write_transaction(self.db(), || {
            let Some((mut key, _)) = self.key_with_secret_hash(key_id)? else {
                return Err(DomainError::NotFound { what: "API key" }.into());
            };
            if key.org_id != org_id {
                return Err(DomainError::NotFound { what: "API key" }.into());
            }
            may_revoke_key(ctx.caller, org_id, &key.effective_permissions()).enforce(
                "API key",
                "a key cannot revoke a key holding permissions it does not hold itself",
            )?;
            if key.revoked_at.is_none() {
                exec(
                    self.db(),
                    "UPDATE api_keys SET revoked_at = ? WHERE id = ?",
                    &[millis(ctx.now), text(key_id)],
                )?;
                key.revoked_at = Some(ctx.now);
                self.append_event(
                    ctx,
                    NewEvent {
                        action: "apikey.revoke",
                        org_id: Some(org_id),
                        visible_to: vec![org_id.to_owned()],
                        subject_id: Some(key_id),
                        ..NewEvent::default()
                    },
                )?;
            }
            Ok(key)
        })
    }

    /// A key and the hash of its secret, for authentication.
    pub fn key_with_secret_hash(&self, key_id: &str) -> Result<Option<(ApiKey, String)>> {
        let result = exec(
            self.db(),
            &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?"),
            &[text(key_id)],
        )?;
        let Some(row) = rows(&result).next() else {
            return Ok(None);
        };
        Ok(Some((read_key(&row)?, row.text(8)?)))
    }
}
