//! Orgs: the accounts that own nodes, hold reservations and run VMs (their keys: [`crate::keys`]).

use reservations_domain::access::{may_create_org, may_read_org};
use reservations_domain::time::from_millis;
use reservations_domain::{DomainError, Timestamp};

use crate::audit::NewEvent;
use crate::rows::{exec, first_row, text};
use crate::write::{Changes, OrgRow, PLATFORM_CHAIN, Planned, Write, WriteContext};
use crate::{Context, Result, Store};

#[derive(Debug, Clone, PartialEq)]
pub struct Org {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
}

impl Store<'_> {
    pub fn create_org(&self, writer: &dyn WriteContext<Org>, id: &str, name: &str) -> Result<Org> {
        let ctx = writer.context();
        may_create_org(ctx.caller).enforce("org", "only platform operators create orgs")?;
        self.write(writer, || {
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
        })
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
