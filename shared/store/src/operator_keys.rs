//! Keys of platform operators: above all orgs, holding every permission. Like org keys, only
//! a hash of the secret is ever stored.

use reservations_domain::storage::{SqlValue, StorageError};
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::rows::{Row, exec, millis, rows};
use crate::schema::text;
use crate::tx::in_write_transaction;
use crate::{Context, Page, Result, Store};

#[derive(Debug, Clone, PartialEq)]
pub struct OperatorKey {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
    pub created_by: String,
    pub revoked_at: Option<Timestamp>,
}

const COLUMNS: &str = "id, name, created_at, created_by, revoked_at, secret_hash";

fn read_key(row: &Row<'_>) -> Result<OperatorKey, StorageError> {
    Ok(OperatorKey {
        id: row.text(0)?,
        name: row.text(1)?,
        created_at: row.time(2)?,
        created_by: row.text(3)?,
        revoked_at: row.opt_time(4)?,
    })
}

impl Store<'_> {
    /// Stores a new operator key; the caller generated its id and secret and passes only the
    /// secret's hash.
    pub fn create_operator_key(
        &self,
        ctx: &Context<'_>,
        id: &str,
        name: &str,
        secret_hash: &str,
    ) -> Result<OperatorKey> {
        in_write_transaction(self.db(), || {
            exec(
                self.db(),
                &format!("INSERT INTO operator_keys ({COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?)"),
                &[
                    text(id),
                    text(name),
                    millis(ctx.now),
                    text(&ctx.caller.key_id),
                    text(secret_hash),
                ],
            )?;
            self.append_event(
                ctx,
                NewEvent {
                    action: "apikey.create",
                    subject_id: Some(id),
                    ..NewEvent::default()
                },
            )?;
            Ok(OperatorKey {
                id: id.to_owned(),
                name: name.to_owned(),
                created_at: ctx.now,
                created_by: ctx.caller.key_id.clone(),
                revoked_at: None,
            })
        })
    }

    /// Operator keys, oldest first; the cursor is the last key id of the previous page.
    pub fn list_operator_keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<OperatorKey>> {
        let limit = limit.clamp(1, 500);
        let fetch = SqlValue::Integer(limit as i64 + 1);
        let result = match after {
            None => exec(
                self.db(),
                &format!("SELECT {COLUMNS} FROM operator_keys ORDER BY created_at, id LIMIT ?"),
                &[fetch],
            )?,
            Some(after) => exec(
                self.db(),
                &format!(
                    "SELECT {COLUMNS} FROM operator_keys WHERE (created_at, id) > \
                     (SELECT created_at, id FROM operator_keys WHERE id = ?1) \
                     ORDER BY created_at, id LIMIT ?2"
                ),
                &[text(after), fetch],
            )?,
        };
        let items = rows(&result)
            .map(|row| read_key(&row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_overfetched(items, limit, |k| k.id.clone()))
    }

    /// Revokes an operator key; takes effect on the next request. Revoking a revoked key
    /// changes nothing.
    pub fn revoke_operator_key(&self, ctx: &Context<'_>, key_id: &str) -> Result<OperatorKey> {
        in_write_transaction(self.db(), || {
            let Some((mut key, _)) = self.operator_key_with_secret_hash(key_id)? else {
                return Err(DomainError::NotFound {
                    what: "operator key",
                }
                .into());
            };
            if key.revoked_at.is_none() {
                exec(
                    self.db(),
                    "UPDATE operator_keys SET revoked_at = ? WHERE id = ?",
                    &[millis(ctx.now), text(key_id)],
                )?;
                key.revoked_at = Some(ctx.now);
                self.append_event(
                    ctx,
                    NewEvent {
                        action: "apikey.revoke",
                        subject_id: Some(key_id),
                        ..NewEvent::default()
                    },
                )?;
            }
            Ok(key)
        })
    }

    /// An operator key and the hash of its secret, for authentication.
    pub fn operator_key_with_secret_hash(
        &self,
        key_id: &str,
    ) -> Result<Option<(OperatorKey, String)>> {
        let result = exec(
            self.db(),
            &format!("SELECT {COLUMNS} FROM operator_keys WHERE id = ?"),
            &[text(key_id)],
        )?;
        let Some(row) = rows(&result).next() else {
            return Ok(None);
        };
        Ok(Some((read_key(&row)?, row.text(5)?)))
    }
}
