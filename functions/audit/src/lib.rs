//! The audit trail: list events (filters, cursor) and verify the hash chain.

use reservations_domain::access::{may_read_audit, may_read_events, may_verify_audit};
use reservations_domain::values::instant;
use reservations_http::Incoming;
use reservations_http::auth::{OPERATOR_KEY_ID, random_hex};
use reservations_http::request::{page_limit, single};
use reservations_http::{Call, Problem, Reply, render, routes, serve};
use reservations_store::audit::{ACTIONS, AuditFilter, ChainPin, FEED_ACTIONS};
use reservations_store::feed::{FeedWait, WAITS_OVERALL, WAITS_PER_KEY, WaitRefused};
use reservations_store::write::node_chain;
use spin_sdk::http::Response;
use spin_sdk::http_component;

#[http_component]
fn handle(incoming: Incoming) -> Response {
    serve(
        routes!("audit"; authenticated: list_events, verify_chain, events_feed),
        incoming,
    )
}

/// A time in the query: a bad one is a 400 naming the parameter, not a 422 naming a field.
fn time_parameter(
    query: &[(String, String)],
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Problem> {
    single(query, name)?
        .map(|text| {
            instant(name, text).map_err(|refused| {
                Problem::bad_request("invalid-parameter", refused.to_string())
                    .with("parameter", name)
            })
        })
        .transpose()
}

/// A typo in `action` would otherwise list nothing and look like an empty trail.
fn action_parameter(query: &[(String, String)]) -> Result<Option<String>, Problem> {
    match single(query, "action")? {
        None => Ok(None),
        Some(action) if ACTIONS.contains(&action) => Ok(Some(action.to_owned())),
        Some(action) => Err(Problem::bad_request(
            "invalid-parameter",
            format!(
                "unknown action {action:?}; use one of {}",
                ACTIONS.join(", ")
            ),
        )
        .with("parameter", "action")),
    }
}

fn list_events(call: &Call<'_>) -> Result<Reply, Problem> {
    may_read_audit(call.caller)
        .enforce("audit trail", "reading the audit trail needs audit.read")?;
    let query = call.query(&[
        "nodeId",
        "reservationId",
        "action",
        "since",
        "until",
        "cursor",
        "limit",
    ])?;
    let after_seq = single(&query, "cursor")?
        .map(|c| {
            c.parse::<i64>().map_err(|_| {
                Problem::bad_request("invalid-parameter", "cursor is not one this API issued")
                    .with("parameter", "cursor")
            })
        })
        .transpose()?;
    let filter = AuditFilter {
        node_id: single(&query, "nodeId")?.map(str::to_owned),
        reservation_id: single(&query, "reservationId")?.map(str::to_owned),
        action: action_parameter(&query)?,
        since: time_parameter(&query, "since")?,
        until: time_parameter(&query, "until")?,
        visible_to_org: call.caller.org_id.clone(),
        after_seq,
        limit: page_limit(&query, 100, 1000)?,
        ..AuditFilter::default()
    };
    let page = call.store.list_audit(&filter)?;
    Ok(Reply::ok(render::page_of_some(&page, call.caller, |row| {
        render::audit_row(row, call.caller)
    })))
}

/// The longest a feed request waits for an event, in seconds.
const MAX_WAIT_SECONDS: u64 = 30;
/// How often a waiting feed looks at the head of what the caller may see (one primary-key
/// probe each time, which also checks that the caller's key still holds).
const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// `GET /v1/events?after=<cursor>&wait=<seconds>&limit=`: the events the caller may see
/// (releases, reclaims, placements, terminations), in order, after `after`. With none yet
/// and `wait` > 0, it takes one of the bounded places of waiting polls (else 429 for a key
/// that holds its share, 503 when the deployment holds all, with `Retry-After`), waits up to
/// `wait` seconds looking only at the head of what the caller may see, and answers as soon as
/// a visible event arrives, or 401 as soon as its key is revoked. `nextCursor` is always
/// given: the point up to which the caller's own events were read, so a resumed poll never
/// reads them again and tells nothing of other orgs' activity.
fn events_feed(call: &Call<'_>) -> Result<Reply, Problem> {
    may_read_events(call.caller).enforce(
        "events",
        "reading the events feed needs audit.read, vm.read or reservation.read",
    )?;
    let query = call.query(&["after", "wait", "limit"])?;
    let mut after = single(&query, "after")?
        .map(|c| {
            c.parse::<i64>()
                .ok()
                .filter(|seq| *seq >= 0)
                .ok_or_else(|| {
                    Problem::bad_request(
                        "invalid-parameter",
                        "after is not a cursor this API issued",
                    )
                    .with("parameter", "after")
                })
        })
        .transpose()?
        .unwrap_or(0);
    let wait = single(&query, "wait")?
        .map(|w| {
            w.parse::<u64>()
                .ok()
                .filter(|w| *w <= MAX_WAIT_SECONDS)
                .ok_or_else(|| {
                    Problem::bad_request(
                        "invalid-parameter",
                        format!(
                            "wait must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}"
                        ),
                    )
                    .with("parameter", "wait")
                })
        })
        .transpose()?
        .unwrap_or(0);
    let limit = page_limit(&query, 100, 1000)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    let mut place = WaitingPlace::none(call);
    loop {
        let head = match call.store.feed_head(call.caller, OPERATOR_KEY_ID) {
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
        if head.seq > after {
            let filter = AuditFilter {
                visible_to_org: call.caller.org_id.clone(),
                after_seq: Some(after),
                up_to_seq: Some(head.seq),
                actions: FEED_ACTIONS,
                limit,
                ..AuditFilter::default()
            };
            let page = call.store.list_audit(&filter)?;
            let next = match &page.next_cursor {
                Some(cursor) => cursor.clone(),
                None => head.seq.to_string(),
            };
            let items: Vec<_> = page
                .items
                .iter()
                .filter_map(|row| render::feed_row(row, call.caller))
                .collect();
            if !items.is_empty() || page.next_cursor.is_some() {
                return Ok(Reply::ok(render::feed(items, next)));
            }
            after = head.seq;
        }
        if std::time::Instant::now() >= deadline {
            return Ok(Reply::ok(render::feed(
                Vec::<render::AuditRowBody<'_>>::new(),
                after.to_string(),
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
        match self
            .call
            .store
            .begin_feed_wait(&self.call.caller.key_id, &id, self.call.now, until)?
        {
            Ok(wait) => {
                self.held = Some(wait);
                Ok(())
            }
            Err(WaitRefused::KeyBusy { retry_after_secs }) => Err(Problem::new(
                429,
                "too-many-waits",
                "Too many waiting polls",
                format!(
                    "this key already has {WAITS_PER_KEY} polls waiting; resume with one of them, or retry without wait"
                ),
            )
            .with_header("retry-after", retry_after_secs.to_string())),
            Err(WaitRefused::ServiceBusy { retry_after_secs }) => Err(Problem::new(
                503,
                "waits-exhausted",
                "No room for another waiting poll",
                format!(
                    "{WAITS_OVERALL} polls are waiting across the service; retry later, or without wait"
                ),
            )
            .with_header("retry-after", retry_after_secs.to_string())),
        }
    }
}

impl Drop for WaitingPlace<'_, '_> {
    fn drop(&mut self) {
        if let Some(wait) = self.held.take() {
            // Should this fail, the place lapses at its end.
            let _ = self.call.store.end_feed_wait(wait);
        }
    }
}

fn verify_chain(call: &Call<'_>) -> Result<Reply, Problem> {
    may_verify_audit(call.caller).enforce(
        "audit trail",
        "only platform operators verify the audit chain",
    )?;
    let query = call.query(&["nodeId", "chain", "pin", "seq", "hash"])?;
    let only = match (single(&query, "nodeId")?, single(&query, "chain")?) {
        (Some(_), Some(_)) => {
            return Err(Problem::bad_request(
                "invalid-parameter",
                "name the chain to verify by nodeId or by chain, not both",
            )
            .with("parameter", "chain"));
        }
        (Some(node_id), None) => Some(node_chain(node_id)),
        (None, chain) => chain.map(str::to_owned),
    };
    let mut pins = query
        .iter()
        .filter(|(name, _)| name == "pin")
        .map(|(_, pin)| parse_pin(pin))
        .collect::<Result<Vec<_>, _>>()?;
    match (single(&query, "seq")?, single(&query, "hash")?) {
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
                seq: parse_seq(seq)?,
                hash: hash.to_owned(),
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
    let verification = call.store.verify_audit_chains(only.as_deref(), &pins)?;
    Ok(Reply::ok(verification))
}

/// `<chain>:<seq>:<hash>`, as an earlier verification's `chains` give them (a chain's name
/// may itself hold colons, e.g. `node:n1`).
fn parse_pin(pin: &str) -> Result<ChainPin, Problem> {
    let invalid = || {
        Problem::bad_request(
            "invalid-parameter",
            "a pin is <chain>:<seq>:<hash>, e.g. node:n1:12:4f2a…",
        )
        .with("parameter", "pin")
    };
    let mut parts = pin.rsplitn(3, ':');
    let (Some(hash), Some(seq), Some(chain)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    if chain.is_empty() || hash.is_empty() {
        return Err(invalid());
    }
    Ok(ChainPin {
        chain: chain.to_owned(),
        seq: parse_seq(seq).map_err(|_| invalid())?,
        hash: hash.to_owned(),
    })
}

fn parse_seq(seq: &str) -> Result<i64, Problem> {
    seq.parse()
        .ok()
        .filter(|seq: &i64| *seq >= 1)
        .ok_or_else(|| {
            Problem::bad_request("invalid-parameter", "seq must be a positive integer")
                .with("parameter", "seq")
        })
}
