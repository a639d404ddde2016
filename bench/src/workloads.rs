//! The operations measured, over HTTP (through the host) and natively (the store over
//! rusqlite in this process, no Wasm, no HTTP): the same requests on the same data.

use std::sync::atomic::{AtomicUsize, Ordering};

use api_client::{Client, Reply};
use reservations_domain::capacity::CapacityAction;
use reservations_store::capacity::{CapacityChange, Representation};
use reservations_store::native::NativeDb;
use reservations_store::{Context, Store};
use serde::Serialize;

use crate::fixtures::{self, owner_capacity_manager, unit_id};
use crate::load::Step;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Release,
    Reclaim,
    /// A reclaim with `noticeSeconds: 120` of units the release pass put on the
    /// market.
    ReclaimNotice,
    DryRun,
    Get,
    /// `GET /v1/events?limit=100` as the owner's capacity manager: one poll of the events
    /// feed (no wait), over the trail the other workloads wrote.
    Events,
    /// `GET /v1/market?nodeId=mk&limit=1000`: the 1 000 released units of a 100 000-unit node.
    Market,
    /// The hello-world component's `GET /hello`.
    Hello,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Release => "release",
            Op::Reclaim => "reclaim",
            Op::ReclaimNotice => "reclaim with notice",
            Op::DryRun => "dry-run",
            Op::Get => "GET reservation",
            Op::Events => "GET events",
            Op::Market => "GET market",
            Op::Hello => "hello-world",
        }
    }

    fn action(self) -> Option<CapacityAction> {
        match self {
            Op::Release => Some(CapacityAction::Release),
            Op::Reclaim | Op::ReclaimNotice => Some(CapacityAction::Reclaim),
            Op::DryRun => Some(CapacityAction::ReclaimDryRun),
            Op::Get | Op::Market | Op::Hello | Op::Events => None,
        }
    }

    /// The notice a request of this kind gives.
    fn notice_seconds(self) -> Option<i64> {
        (self == Op::ReclaimNotice).then_some(NOTICE_SECONDS)
    }

    fn path_suffix(self) -> &'static str {
        match self {
            Op::Release => "/release",
            Op::Reclaim | Op::ReclaimNotice => "/reclaim",
            Op::DryRun => "/reclaim/dry-run",
            Op::Get | Op::Market | Op::Hello | Op::Events => "",
        }
    }
}

/// The notice of [`Op::ReclaimNotice`].
pub const NOTICE_SECONDS: i64 = 120;

/// The page size of an [`Op::Events`] poll.
pub const EVENTS_PAGE: usize = 100;

/// Which unit each request names.
pub enum Units<'a> {
    /// Always the same unit.
    Fixed(String),
    /// The next unit of a shared sequence, up to a limit (a fresh unit per release, and the
    /// same units again for the reclaims).
    Sequence { next: &'a AtomicUsize, limit: usize },
    /// The next of a shared sequence over [`fixtures::SPREAD_NODES`] nodes: request `n`
    /// names node `n % nodes` and its unit `n / nodes`.
    Spread { next: &'a AtomicUsize, limit: usize },
}

impl Units<'_> {
    /// The unit the next request names, and its node when it is not the target's.
    fn take(&self) -> Option<(Option<String>, String)> {
        match self {
            Units::Fixed(unit) => Some((None, unit.clone())),
            Units::Sequence { next, limit } => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                (i < *limit).then(|| (None, unit_id(i)))
            }
            Units::Spread { next, limit } => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let nodes = fixtures::SPREAD_NODES;
                (i < *limit).then(|| (Some(fixtures::spread_node(i % nodes)), unit_id(i / nodes)))
            }
        }
    }
}

/// One kind of request against one reservation.
pub struct Target<'a> {
    pub op: Op,
    pub node: String,
    pub units: Units<'a>,
    pub representation: Representation,
}

impl<'a> Target<'a> {
    pub fn new(op: Op, node: &str, units: Units<'a>, representation: Representation) -> Self {
        Target {
            op,
            node: node.to_owned(),
            units,
            representation,
        }
    }
}

/// A keep-alive HTTP client of one worker: the suites' client, without their OpenAPI checks
/// (the cost measured is the server's).
pub struct HttpWorker {
    client: Client,
}

impl HttpWorker {
    pub fn new(base: &str, token: Option<&str>) -> HttpWorker {
        HttpWorker {
            client: Client::new(base, token.map(str::to_owned)).without_contract(),
        }
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<(u16, String)> {
        let reply = self
            .client
            .try_send(
                "POST",
                path,
                Some("application/json"),
                Some(body.to_string().as_bytes()),
            )
            .map_err(anyhow::Error::msg)?;
        Ok((reply.status, reply.text()))
    }

    /// One request of `target`.
    pub fn run(&self, target: &Target<'_>) -> Step {
        let (status, body) = match target.op {
            Op::Hello => self.get("/hello"),
            Op::Market => self.get(&format!(
                "/v1/market?nodeId={}&limit={}",
                target.node,
                fixtures::MARKET_RELEASED
            )),
            Op::Get => self.get(&format!(
                "/v1/nodes/{}/reservations/{}",
                target.node,
                fixtures::reservation_of(&target.node)
            )),
            Op::Events => self.get(&format!("/v1/events?limit={EVENTS_PAGE}")),
            op => {
                let Some((node, unit)) = target.units.take() else {
                    return Step::Exhausted;
                };
                let node = node.unwrap_or_else(|| target.node.clone());
                let path = format!(
                    "/v1/nodes/{node}/reservations/{}{}",
                    fixtures::reservation_of(&node),
                    op.path_suffix()
                );
                let client = if target.representation == Representation::Minimal {
                    self.client.with_header("prefer", "return=minimal")
                } else {
                    self.client.clone()
                };
                let body = match op.notice_seconds() {
                    Some(notice) => format!(
                        r#"{{"unitIds":["{unit}"],"reason":"bench","noticeSeconds":{notice}}}"#
                    ),
                    None => format!(r#"{{"unitIds":["{unit}"],"reason":"bench"}}"#),
                };
                read(client.try_send(
                    "POST",
                    &path,
                    Some("application/json"),
                    Some(body.as_bytes()),
                ))
            }
        };
        match status {
            200 => Step::Done,
            _ => Step::Failed(format!(
                "{} answered {status}: {}",
                target.op.name(),
                body.chars().take(300).collect::<String>()
            )),
        }
    }

    fn get(&self, path: &str) -> (u16, String) {
        read(self.client.try_send("GET", path, None, None))
    }
}

/// The status and body of an answer; status 0 and the error when none arrived.
fn read(result: Result<Reply, String>) -> (u16, String) {
    match result {
        Ok(reply) => (reply.status, reply.text()),
        Err(e) => (0, e),
    }
}

/// One worker's own connection to the database, as a component instance has.
pub struct NativeWorker {
    db: NativeDb,
}

impl NativeWorker {
    pub fn open(path: &std::path::Path) -> NativeWorker {
        NativeWorker {
            db: NativeDb::open(path).expect("open the native database"),
        }
    }

    /// The same store calls a component makes for one request of `target` (including
    /// opening the store, which checks the schema version), without Wasm, HTTP, auth or
    /// JSON rendering.
    pub fn run(&self, target: &Target<'_>) -> Step {
        let caller = owner_capacity_manager();
        let ctx = Context {
            caller: &caller,
            now: chrono::Utc::now(),
            request_id: "bench-native",
            client_request_id: None,
        };
        let store = match Store::open(&self.db) {
            Ok(store) => store,
            Err(e) => return Step::Failed(e.to_string()),
        };
        let reservation = fixtures::reservation_of(&target.node);
        let outcome = match target.op.action() {
            None if target.op == Op::Market => store
                .market()
                .offers(Some(&target.node), None, fixtures::MARKET_RELEASED, ctx.now)
                .and_then(|page| {
                    if page.items.len() == fixtures::MARKET_RELEASED {
                        Ok(())
                    } else {
                        Err(reservations_store::StoreError::Storage(
                            reservations_store::StorageError::Other(
                                format!("the market listed {} units", page.items.len()).into(),
                            ),
                        ))
                    }
                }),
            None if target.op == Op::Events => store
                .trail()
                .list_audit(&reservations_store::audit::AuditFilter {
                    visible_to_org: caller.org_id.clone(),
                    actions: reservations_store::audit::FEED_ACTIONS,
                    limit: EVENTS_PAGE,
                    ..Default::default()
                })
                .map(drop),
            None => store
                .capacity()
                .read_reservation(&ctx, &target.node, &reservation)
                .map(drop),
            Some(action) => {
                let Some((node, unit)) = target.units.take() else {
                    return Step::Exhausted;
                };
                let node = node.unwrap_or_else(|| target.node.clone());
                store
                    .capacity()
                    .change_capacity(
                        &ctx,
                        CapacityChange {
                            action,
                            node_id: &node,
                            reservation_id: &fixtures::reservation_of(&node),
                            unit_ids: std::slice::from_ref(&unit),
                            reason: Some("bench"),
                            representation: target.representation,
                            notice_seconds: target.op.notice_seconds(),
                            until: None,
                        },
                    )
                    .map(drop)
            }
        };
        match outcome {
            Ok(()) => Step::Done,
            Err(e) => Step::Failed(format!("native {}: {e}", target.op.name())),
        }
    }
}
