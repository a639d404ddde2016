//! Orgs: the accounts that own nodes, hold reservations and run VMs (their keys: [`crate::keys`]).

use std::collections::BTreeSet;

use reservations_domain::access::{may_create_org, may_read_org};
use reservations_domain::time::from_millis;
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::storage::SqlValue;
use crate::storage::{exec, first_row, json_list, text};
use crate::write::{Changes, OrgRow, PLATFORM_CHAIN, Planned, Write};
use crate::{Context, Identity, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct Org {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
}

impl Identity<'_, '_> {
    pub fn create_org(&self, ctx: &Context<'_>, id: &str, name: &str) -> Result<Org> {
        self.carry_out(ctx, || self.plan_create_org(ctx, id, name))
    }

    /// The plan of [`Identity::create_org`] from fresh facts.
    pub fn plan_create_org(&self, ctx: &Context<'_>, id: &str, name: &str) -> Result<Planned<Org>> {
        may_create_org(ctx.caller).enforce("org", "only platform operators create orgs")?;
        let (org_exists, basis) = self.platform_facts("orgs", id)?;
        if org_exists {
            return Err(DomainError::AlreadyExists {
                what: "org",
                id: id.to_owned(),
            }
            .into());
        }
        let changes = Changes {
            orgs: vec![OrgRow {
                id: id.to_owned(),
                name: name.to_owned(),
            }],
            ..Changes::default()
        };
        let event = NewEvent {
            action: "org.create",
            org_id: Some(id.to_owned()),
            visible_to: vec![id.to_owned()],
            ..NewEvent::default()
        };
        let org = Org {
            id: id.to_owned(),
            name: name.to_owned(),
            created_at: from_millis(ctx.now.timestamp_millis()),
        };
        Ok(Planned::new(
            org,
            Write::new(PLATFORM_CHAIN.to_owned(), basis, event, changes),
        ))
    }

    /// Which of `ids` name orgs, for a cell other than the directory's, which holds only
    /// copies of the orgs its rows name: those of `ids` it lacks are looked up in the
    /// directory and copied here (orgs never change and are never deleted, so a copy stays
    /// true, and copying again changes nothing). Without a directory, this store's own.
    pub(crate) fn orgs_from_directory(&self, ids: &[String]) -> Result<Vec<String>> {
        let Some(directory) = self.directory else {
            let result = exec(
                self.db(),
                "SELECT json_group_array(id) AS known FROM orgs \
                 WHERE id IN (SELECT value FROM json_each(?1))",
                &[json_list(ids)],
            )?;
            return Ok(first_row(&result)
                .map(|row| row.json("known"))
                .transpose()?
                .unwrap_or_default());
        };
        let result = exec(
            directory.db(),
            "SELECT json_group_array(json_array(id, name, created_at)) AS orgs FROM orgs \
             WHERE id IN (SELECT value FROM json_each(?1))",
            &[json_list(ids)],
        )?;
        let orgs: Vec<(String, String, i64)> = first_row(&result)
            .map(|row| row.json("orgs"))
            .transpose()?
            .unwrap_or_default();
        if !orgs.is_empty() {
            exec(
                self.db(),
                "INSERT OR IGNORE INTO orgs (id, name, created_at) \
                 SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?1)",
                &[SqlValue::Text(
                    serde_json::to_string(&orgs).expect("plain values"),
                )],
            )?;
        }
        Ok(orgs.into_iter().map(|(id, ..)| id).collect())
    }

    /// The orgs of `named` that exist: those this cell has (`here`), and in a cell other than
    /// the directory's, those it lacks that the directory has (copied here).
    pub(crate) fn known_orgs(
        &self,
        mut here: BTreeSet<String>,
        named: &[String],
    ) -> Result<BTreeSet<String>> {
        let missing: Vec<String> = named
            .iter()
            .filter(|id| !here.contains(*id))
            .cloned()
            .collect();
        if self.directory.is_some() && !missing.is_empty() {
            here.extend(self.orgs_from_directory(&missing)?);
        }
        Ok(here)
    }

    /// An org, as the caller may read it (its own, or any for an operator).
    pub fn read_org(&self, ctx: &Context<'_>, id: &str) -> Result<Org> {
        may_read_org(ctx.caller, id).enforce("org", "")?;
        self.get_org(id)?
            .ok_or_else(|| DomainError::NotFound { what: "org" }.into())
    }

    pub fn get_org(&self, id: &str) -> Result<Option<Org>> {
        let result = exec(
            self.db(),
            "SELECT id, name, created_at FROM orgs WHERE id = ?",
            &[text(id)],
        )?;
        let Some(row) = first_row(&result) else {
            return Ok(None);
        };
        Ok(Some(Org {
            id: row.text("id")?,
            name: row.text("name")?,
            created_at: row.time("created_at")?,
        }))
    }
}
