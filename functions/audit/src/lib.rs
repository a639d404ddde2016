//! The audit trail: list events (filters, cursor) and verify the hash chain.

use std::time::Duration;

use reservations_http::deserialize_from_text;
use reservations_http::input::{FromText, Limit, Query, Time};
use reservations_http::read::TrailPosition;
use reservations_http::{Call, Incoming, Problem, Read, routes, serve};
use reservations_store::audit::{ACTIONS, AuditFilter, ChainPin};
use reservations_store::write::node_chain;
use serde::Deserialize;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("audit"; authenticated: list_events, verify_chain, events_feed),
        incoming,
    )
}

/// `GET /v1/audit`: the events the caller may see, filtered, a page at a time.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuditListing {
    node_id: Option<String>,
    reservation_id: Option<String>,
    action: Option<Action>,
    since: Option<Time>,
    until: Option<Time>,
    cursor: Option<TrailPosition>,
    #[serde(default)]
    limit: Limit<100, 1000>,
}

/// An audited action. A typo would otherwise list nothing and look like an empty trail.
struct Action(String);

impl FromText for Action {
    fn from_text(text: &str) -> Result<Self, String> {
        match ACTIONS.contains(&text) {
            true => Ok(Action(text.to_owned())),
            false => Err(format!(
                "unknown action {text:?}; use one of {}",
                ACTIONS.join(", ")
            )),
        }
    }
}

fn list_events(_: &Call<'_>, Query(query): Query<AuditListing>) -> Result<Read, Problem> {
    let filter = AuditFilter {
        node_id: query.node_id,
        reservation_id: query.reservation_id,
        action: query.action.map(|action| action.0),
        since: query.since.map(|time| time.0),
        until: query.until.map(|time| time.0),
        limit: query.limit.get(),
        ..AuditFilter::default()
    };
    Ok(Read::Trail {
        filter,
        after: query.cursor,
    })
}

/// The longest a feed request waits for an event, in seconds.
const MAX_WAIT_SECONDS: u64 = 30;
/// The events feed's query: where to resume, how long to wait for an event.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedQuery {
    after: Option<TrailPosition>,
    wait: Option<WaitSeconds>,
    #[serde(default)]
    limit: Limit<100, 1000>,
}

/// How long a feed request may wait for an event: 0 to [`MAX_WAIT_SECONDS`].
struct WaitSeconds(u64);

impl FromText for WaitSeconds {
    fn from_text(text: &str) -> Result<Self, String> {
        text.parse::<u64>()
            .ok()
            .filter(|wait| *wait <= MAX_WAIT_SECONDS)
            .map(WaitSeconds)
            .ok_or_else(|| {
                format!("must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}")
            })
    }
}

/// `GET /v1/events?after=<cursor>&wait=<seconds>&limit=`: the events the caller may see
/// (releases, reclaims, placements, terminations), in order, after `after`, waiting up to
/// `wait` seconds for one (docs/design.md, "The events feed").
fn events_feed(_: &Call<'_>, Query(query): Query<FeedQuery>) -> Result<Read, Problem> {
    Ok(Read::Feed {
        after: query.after,
        wait: Duration::from_secs(query.wait.map_or(0, |wait| wait.0)),
        limit: query.limit.get(),
    })
}

/// `GET /v1/audit/verify`: which chains to verify (all by default), and what to check
/// them against: pins of earlier verifications, several as `pin=<chain>:<seq>:<hash>` or one
/// of the named chain as `seq` and `hash`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Verification {
    node_id: Option<String>,
    chain: Option<String>,
    #[serde(default)]
    pin: Vec<ChainPinText>,
    seq: Option<PinnedSeq>,
    hash: Option<String>,
}

fn verify_chain(_: &Call<'_>, Query(query): Query<Verification>) -> Result<Read, Problem> {
    let only = match (query.node_id, query.chain) {
        (Some(_), Some(_)) => {
            return Err(Problem::bad_request(
                "invalid-parameter",
                "name the chain to verify by nodeId or by chain, not both",
            )
            .with("parameter", "chain"));
        }
        (Some(node_id), None) => Some(node_chain(&node_id)),
        (None, chain) => chain,
    };
    let mut pins: Vec<ChainPin> = query.pin.into_iter().map(|pin| pin.0).collect();
    match (query.seq, query.hash) {
        (None, None) => {}
        (Some(seq), Some(hash)) => {
            let chain = only.clone().ok_or_else(|| {
                Problem::bad_request(
                    "invalid-parameter",
                    "seq and hash pin an event of the chain named by nodeId or chain; to pin several chains, use pin=<chain>:<seq>:<hash>",
                )
                .with("parameter", "seq")
            })?;
            pins.push(ChainPin {
                chain,
                seq: seq.0,
                hash,
            });
        }
        (seq, _) => {
            let missing = if seq.is_none() { "seq" } else { "hash" };
            return Err(Problem::bad_request(
                "invalid-parameter",
                "a pin is seq and hash together (a chain's lastSeq and lastHash from an earlier verification)",
            )
            .with("parameter", missing));
        }
    }
    Ok(Read::Chains { only, pins })
}

/// `<chain>:<seq>:<hash>`, as an earlier verification's `chains` give them (a chain's name
/// may itself hold colons, e.g. `node:n1`).
struct ChainPinText(ChainPin);

impl FromText for ChainPinText {
    fn from_text(pin: &str) -> Result<Self, String> {
        let invalid = || "a pin is <chain>:<seq>:<hash>, e.g. node:n1:12:4f2a…".to_owned();
        let mut parts = pin.rsplitn(3, ':');
        let (Some(hash), Some(seq), Some(chain)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        if chain.is_empty() || hash.is_empty() {
            return Err(invalid());
        }
        Ok(ChainPinText(ChainPin {
            chain: chain.to_owned(),
            seq: PinnedSeq::from_text(seq).map_err(|_| invalid())?.0,
            hash: hash.to_owned(),
        }))
    }
}

/// The position of a pinned event in its chain: 1 or more.
struct PinnedSeq(i64);

impl FromText for PinnedSeq {
    fn from_text(text: &str) -> Result<Self, String> {
        text.parse()
            .ok()
            .filter(|seq: &i64| *seq >= 1)
            .map(PinnedSeq)
            .ok_or_else(|| "must be a positive integer".to_owned())
    }
}

deserialize_from_text!(Action, WaitSeconds, ChainPinText, PinnedSeq);
