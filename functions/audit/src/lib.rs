//! The audit trail: list events (filters, cursor) and verify the hash chain.

use reservations_http::auth::{OPERATOR_KEY_ID, random_hex};
use reservations_http::deserialize_from_text;
use reservations_http::input::{FromText, Limit, Query, Time, TrailPosition};
use reservations_http::{Call, Incoming, Problem, Reply, render, routes, serve};
use reservations_store::Page;
use reservations_store::audit::{ACTIONS, AuditFilter, ChainPin};
use reservations_store::feed::{
    FeedWait, WAITS_OVERALL, WAITS_PER_KEY, WAITS_PER_ORG, WaitRefused,
};
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

fn list_events(call: &Call<'_>, Query(query): Query<AuditListing>) -> Result<Reply, Problem> {
    let filter = AuditFilter {
        node_id: query.node_id,
        reservation_id: query.reservation_id,
        action: query.action.map(|action| action.0),
        since: query.since.map(|time| time.0),
        until: query.until.map(|time| time.0),
        limit: query.limit.get(),
        ..AuditFilter::default()
    };
    let after = TrailPosition::in_trail(query.cursor.as_ref(), call, "cursor")?;
    let trail = call.stores.read_audit(call.caller, filter, &after)?;
    let page = Page {
        items: trail.rows.into_iter().map(|(_, row)| row).collect(),
        next_cursor: trail.more.then(|| trail.next.format()),
        unreadable: Vec::new(),
    };
    Ok(Reply::ok(render::page_of_some(&page, call.caller, |row| {
        render::audit_row(row, call.caller)
    })))
}

/// The longest a feed request waits for an event, in seconds.
const MAX_WAIT_SECONDS: u64 = 30;
/// How often a waiting feed looks at the head of what the caller may see (one primary-key
/// probe each time, which also checks that the caller's key still holds).
const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

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
/// (releases, reclaims, placements, terminations), in order, after `after`. With none yet
/// and `wait` > 0, it takes one of the bounded places of waiting polls (else 429 for a key or
/// an org that holds its share, 503 when the deployment holds all, with `Retry-After`), waits up to
/// `wait` seconds looking only at the head of what the caller may see, and answers as soon as
/// a visible event arrives, or 401 as soon as its key is revoked. `nextCursor` is always
/// given: the point up to which the caller's own events were read, so a resumed poll never
/// reads them again and tells nothing of other orgs' activity.
fn events_feed(call: &Call<'_>, Query(query): Query<FeedQuery>) -> Result<Reply, Problem> {
    let mut after = TrailPosition::in_trail(query.after.as_ref(), call, "after")?;
    let wait = query.wait.map_or(0, |wait| wait.0);
    let limit = query.limit.get();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    // A poll that means to wait and that a bound refuses is refused before any cell is read:
    // a flood of one key's polls then costs its key's look-up and one read of the directory
    // each, whatever the number of cells (docs/design.md, "The events feed").
    if wait > 0
        && let Some(refused) = call.store.feed().feed_wait_refused(call.caller, call.now)?
    {
        return Err(wait_refused(refused));
    }
    let mut place = WaitingPlace::none(call);
    loop {
        let head = match call.stores.feed_head(call.caller, OPERATOR_KEY_ID) {
            Ok(head) => head,
            // A waiting poll skips a look the database could not answer (busy, or out of
            // reach for a moment): the next one asks again, up to the deadline.
            Err(e)
                if e.is_transient() && place.is_held() && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(POLL_INTERVAL);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if !head.key_valid {
            return Err(Problem::unauthorized("the token is unknown or revoked"));
        }
        if !after.covers(&head.heads) {
            let page = call
                .stores
                .read_feed(call.caller, &after, &head.heads, limit)?;
            // Read to the heads, the poll resumes from them: past events it may not see.
            let mut next = page.next.clone();
            if !page.more {
                next.join(&head.heads);
            }
            let items: Vec<_> = page
                .rows
                .iter()
                .filter_map(|(_, row)| render::feed_row(row, call.caller))
                .collect();
            if !items.is_empty() || page.more {
                return Ok(Reply::ok(render::feed(items, next.format())));
            }
            after = next;
        }
        if std::time::Instant::now() >= deadline {
            return Ok(Reply::ok(render::feed(
                Vec::<render::AuditRowBody<'_>>::new(),
                after.format(),
            )));
        }
        place.take(deadline)?;
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The place a waiting poll holds among the bounded waits, given back when the poll answers
/// (and lapsing by itself should the instance be stopped first).
struct WaitingPlace<'c, 'a> {
    call: &'c Call<'a>,
    held: Option<FeedWait>,
}

impl<'c, 'a> WaitingPlace<'c, 'a> {
    fn none(call: &'c Call<'a>) -> Self {
        WaitingPlace { call, held: None }
    }

    fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Takes a place for a wait until `deadline`, unless one is held already.
    fn take(&mut self, deadline: std::time::Instant) -> Result<(), Problem> {
        if self.held.is_some() {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        // The place lapses a little after the poll's last answer could have gone.
        let until = self.call.now
            + chrono::Duration::from_std(remaining).unwrap_or_default()
            + chrono::Duration::seconds(2);
        let id = format!("wait-{}", random_hex(8));
        let caller = self.call.caller;
        match self.call.store.feed().begin_feed_wait(
            &caller.key_id,
            caller.org_id.as_deref(),
            &id,
            self.call.now,
            until,
        )? {
            Ok(wait) => {
                self.held = Some(wait);
                Ok(())
            }
            Err(refused) => Err(wait_refused(refused)),
        }
    }
}

/// A poll a bound refuses a place: 429 for a key or an org that holds its share, 503 when the
/// deployment holds all, with `Retry-After` the time the earliest of those places lapses.
fn wait_refused(refused: WaitRefused) -> Problem {
    let (problem, retry_after_secs) = match refused {
        WaitRefused::KeyBusy { retry_after_secs } => (
            Problem::new(
                429,
                "too-many-waits",
                "Too many waiting polls",
                format!(
                    "this key already has {WAITS_PER_KEY} polls waiting; resume with one of them, or retry without wait"
                ),
            ),
            retry_after_secs,
        ),
        WaitRefused::OrgBusy { retry_after_secs } => (
            Problem::new(
                429,
                "too-many-org-waits",
                "Too many waiting polls of this org",
                format!(
                    "this org's keys already have {WAITS_PER_ORG} polls waiting; resume with one of them, or retry without wait"
                ),
            ),
            retry_after_secs,
        ),
        WaitRefused::ServiceBusy { retry_after_secs } => (
            Problem::new(
                503,
                "waits-exhausted",
                "No room for another waiting poll",
                format!(
                    "{WAITS_OVERALL} polls are waiting across the service; retry later, or without wait"
                ),
            ),
            retry_after_secs,
        ),
    };
    problem.with_header("retry-after", retry_after_secs.to_string())
}

impl Drop for WaitingPlace<'_, '_> {
    fn drop(&mut self) {
        if let Some(wait) = self.held.take() {
            // Should this fail, the place lapses at its end.
            let _ = self.call.store.feed().end_feed_wait(wait);
        }
    }
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

fn verify_chain(call: &Call<'_>, Query(query): Query<Verification>) -> Result<Reply, Problem> {
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
    let verification = call
        .stores
        .verify_audit(call.caller, only.as_deref(), &pins)?;
    Ok(Reply::ok(verification))
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
