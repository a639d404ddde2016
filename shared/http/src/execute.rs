//! The executor of an authenticated request, in the order it runs: the head's checks, a
//! write sent home whole where this app is not its home, the caller authenticated, the
//! `Bookmark` compared, the body read, the handler's read or operation; a read answered
//! ([`crate::read`]); for a write the idempotency look-up, then each attempt's plan and
//! answer ([`crate::operation`]), its one
//! write statement, a retry when its facts moved, the refusal recorded under a key, and the
//! response with its bookmark (docs/design.md, "How a request flows"). Each step is a call
//! that returns here.

use chrono::Utc;
use reservations_domain::access::Caller;
use reservations_store::cells::{Cell, CellStores, DIRECTORY_LABEL, Positions};
use reservations_store::idempotency::{self as records, KeyedRequest, Lookup, StoredResponse};
use reservations_store::site::BookmarkReach;
use reservations_store::storage::KEYED_LOOKUPS;
use reservations_store::write::{WriteAttempts, Written};
use reservations_store::{Context, Store, StoreError};
use spin_sdk::http::{Method as SpinMethod, Request, Response};

use crate::auth::{authenticate, bearer_token};
use crate::bookmark::{self, BOOKMARK_HEADER, BookmarkSeal, SentBookmark};
use crate::config::{AppConfig, SpinDb};
use crate::forward::{self, HomeApp};
use crate::input::{Answer, Call};
use crate::operation::{Home, Operation};
use crate::problem::{ALREADY_RECORDED, PROBLEM_CONTENT_TYPE, Problem};
use crate::render::{Reply, json_response, outcome_response};
use crate::request_log::{self, Forwarded};
use crate::routes::{
    self, AuthenticatedHandler, Endpoint, Head, Idempotency, PathParams, REQUEST_ID_HEADER,
    RequestIds, UnreadBody, refuse_declared_oversize, single_header,
};

/// Serves an authenticated endpoint, step by step (see the module's comment): the head's
/// checks, a write sent home where this app is not home, the cells' stores opened, then the
/// caller's request ([`serve_caller`]).
pub(crate) fn authenticated(
    head: &Head<'_>,
    body: UnreadBody,
    (endpoint, home): (Endpoint, routes::Home),
    ids: &RequestIds,
    handler: AuthenticatedHandler,
) -> Result<Response, Problem> {
    let Head {
        request,
        repeated_headers,
        ..
    } = *head;
    refuse_declared_oversize(request, endpoint.max_body)?;
    for name in ["content-type", "content-length", "x-request-id"] {
        single_header(request, repeated_headers, name)?;
    }
    let config = AppConfig::read()?;
    let token = bearer_token(single_header(request, repeated_headers, "authorization")?)?;
    let bookmark = bookmark::requested(request, repeated_headers, config.cells)?;
    if !endpoint.is_read()
        && let Some(home) = &config.home
    {
        return write_at_home(home, head, body, endpoint, ids, &config, bookmark.as_ref());
    }
    let bucket = crate::config::DefaultBucket::default();
    // A waiting request holds its instance and, if admitted, a database connection: one
    // token's many are refused here, before anything touches the database.
    let _admitted = match endpoint.waits && config.feed_requests_per_token > 0 {
        true => admit_waiting_request(&bucket, token, config.feed_requests_per_token)?,
        false => None,
    };
    let audit_key = config.audit_key.as_bytes();
    let share = config.org_write_share;
    let opened = |db, label: &str| -> Result<Store<'_>, reservations_store::StoreError> {
        let store = Store::keyed(db, audit_key)?
            .remembering_its_site(&bucket, &config.remembered_as(label));
        Ok(match share > 0 {
            true => store.with_write_shares(&bucket, share),
            false => store,
        })
    };
    let databases: Vec<SpinDb> = config
        .cells
        .all()
        .map(|cell| SpinDb::open(&cell.label()))
        .collect();
    let directory = opened(&databases[0], DIRECTORY_LABEL)?;
    let mut others = Vec::new();
    for (cell, db) in config.cells.all().zip(&databases).skip(1) {
        others.push(opened(db, &cell.label())?.with_directory(&directory));
    }
    let stores = CellStores::new(config.cells, &directory, others);
    let credentials = Credentials {
        token,
        config: &config,
        bookmark,
    };
    let served = serve_caller(
        head,
        body,
        (endpoint, home),
        ids,
        handler,
        &stores,
        &credentials,
    );
    // A cell whose database this request lost is reported by health for a while.
    for (cell, store) in stores.all().skip(1) {
        if store.lost_its_database() {
            crate::cell_health::remember_lost(&bucket, &cell.label(), Utc::now());
        }
    }
    served
}

/// [`authenticated`] once the databases can be opened: the caller known first (at the
/// directory), the body read only then, the handler's answer or operation, carried out under
/// the idempotency protocol at the request's home cell, a write's answer given its bookmark.
fn serve_caller(
    head: &Head<'_>,
    body: UnreadBody,
    (endpoint, home): (Endpoint, routes::Home),
    ids: &RequestIds,
    handler: AuthenticatedHandler,
    stores: &CellStores<'_>,
    credentials: &Credentials<'_>,
) -> Result<Response, Problem> {
    let Head {
        request,
        repeated_headers,
        params,
    } = *head;
    let Credentials {
        token,
        config,
        ref bookmark,
    } = *credentials;
    let directory = stores.directory();
    let caller = match authenticate(directory, token, &config.operator_token) {
        Err(refused) if bookmark.is_some() && refused.status == 401 => {
            authenticate_as_the_copy_catches_up(directory, token, config, refused)?
        }
        known => known?,
    };
    request_log::caller(&caller);
    // Only for a known caller is the bookmark's seal checked, and any bookmark this API did
    // not seal refused alike: a stranger learns nothing from one, and nobody learns a
    // position from forging one.
    let seal = BookmarkSeal::new(config.audit_key.as_bytes());
    let bookmark = match bookmark {
        Some(sent) => Some(seal.open(sent, config.cells)?),
        None => None,
    };
    // Only for a known caller is the bookmark compared with the database: a stranger learns
    // nothing from it, and asks the primary nothing. A request about one node or VM reads
    // its cell only; any other, every cell the bookmark names.
    let path_cell = cell_named_by_path(stores, home, params);
    if let Some(position) = &bookmark
        && !bookmark_reached(stores, position, path_cell)?
        && endpoint.is_read()
    {
        return Err(bookmark::not_reached());
    }
    // Only now, for a known caller, is the body read: within the endpoint's limit and the
    // deadline, so no stranger can make the server hold bytes or wait.
    let body = body.read(endpoint.max_body, config.body_deadline_ms)?;
    let path_home = path_cell.unwrap_or(Cell::DIRECTORY);
    let now = Utc::now();
    let answer = handler(&Call {
        request,
        params,
        ids,
        now,
        caller: &caller,
        body: &body,
    });
    // The cell the request is at home in: its operation's, else the one its path names.
    let home_cell = match &answer {
        Ok(Answer::Write(operation)) => home_of(stores, operation),
        _ => path_home,
    };
    request_log::home_cell(home_cell.label());
    let arrival = forward::arrival(request, config.audit_key.as_bytes());
    if arrival.is_some() {
        request_log::forwarded(Forwarded::FromSite);
    }
    let key = match arrival {
        Some(forward::Arrival {
            own_key: Some(key),
            resent,
        }) => Some(Key::Forwarders { key, resent }),
        _ => idempotency_key(request, repeated_headers)?.map(Key::Callers),
    };
    // A key that may change nothing is refused whatever it sends: it leaves no record, so
    // read-only keys cannot fill the database with them.
    let key = key.filter(|_| {
        endpoint.idempotency() == Idempotency::Record
            && *request.method() == SpinMethod::Post
            && caller.may_write()
    });
    let context = Context {
        caller: &caller,
        now,
        request_id: &ids.server,
        client_request_id: ids.client.as_deref(),
    };
    let instance = request.path();
    let operation = match answer {
        Ok(Answer::Read(read)) => {
            let reply = read.answer(stores, &context);
            return Ok(outcome_response(&reply, &ids.server, instance));
        }
        Ok(Answer::Write(operation)) => Ok(operation),
        Err(problem) => Err(problem),
    };
    let mut response = match key {
        None => {
            let outcome = operation.and_then(|operation| {
                carried_out(&operation, stores, home_cell, &context, None).map(|(reply, _)| reply)
            });
            outcome_response(&outcome, &ids.server, instance)
        }
        Some(key) => {
            let keyed = KeyedRequest {
                caller_key_id: &caller.key_id,
                idempotency_key: key.text(),
                fingerprint: records::fingerprint(
                    &request.method().to_string(),
                    &path_and_query(request),
                    &body,
                ),
                now,
            };
            let run = Keyed {
                key: &key,
                request: &keyed,
                instance,
            };
            under_key(&operation, stores, home_cell, &context, &run)?
        }
    };
    if !endpoint.is_read() {
        stamp_bookmark(&mut response, &seal, stores, home_cell, bookmark.as_ref())?;
    }
    Ok(response)
}

/// A request under an `Idempotency-Key`: the key, and what its record is kept under.
struct Keyed<'k> {
    key: &'k Key,
    request: &'k KeyedRequest<'k>,
    /// The request's path, the `instance` of a problem it answers.
    instance: &'k str,
}

/// The idempotency protocol: a recorded answer replayed, a reused key refused (422), or the
/// request carried out once, its answer recorded by its write (see
/// `reservations_store::idempotency`) or, when it wrote nothing (a refusal), by a statement of
/// its own. A duplicate carried out meanwhile is found by the write, which is then refused
/// whole, and its answer replayed. With the market in cells, a caller's key is first claimed
/// in the directory, so that it is refused for another request at home in any cell.
fn under_key(
    operation: &Result<Operation, Problem>,
    stores: &CellStores<'_>,
    home: Cell,
    context: &Context<'_>,
    keyed: &Keyed<'_>,
) -> Result<Response, Problem> {
    let store = stores.store(home);
    let request_id = context.request_id;
    let callers = matches!(keyed.key, Key::Callers(_));
    if callers && stores.cells().count() > 1 && !stores.directory().claim_key(keyed.request)? {
        return Err(key_reused());
    }
    // A forwarding app's key is fresh at its first send: there is nothing to look up.
    let fresh = matches!(keyed.key, Key::Forwarders { resent: false, .. });
    let mut attempts = 0;
    loop {
        attempts += 1;
        // Looked up again, the key was recorded by a duplicate meanwhile.
        let lookup = match fresh && attempts == 1 {
            true => Lookup::Fresh,
            false => store.look_up(keyed.request)?,
        };
        match lookup {
            Lookup::Replay(stored) => return Ok(replay(stored, request_id)),
            Lookup::Mismatch => return Err(key_reused()),
            Lookup::Fresh => {}
        }
        let outcome = match operation {
            Ok(operation) => carried_out(operation, stores, home, context, Some(keyed)),
            Err(problem) => Err(problem.clone()),
        };
        let recorded = matches!(outcome, Ok((_, true)));
        let outcome = outcome.map(|(reply, _)| reply);
        match &outcome {
            Err(problem) if problem.code == ALREADY_RECORDED && attempts < KEYED_LOOKUPS => {
                continue;
            }
            // A server failure is not recorded, so that a retry gets another chance.
            Err(problem) if problem.status >= 500 => {}
            // Nor is a refusal for want of permission: a key's permissions never change, so
            // a retry is refused the same way, and a key that may not write leaves nothing.
            Err(problem) if problem.status == 403 => {}
            _ if recorded => {}
            // A forwarding app's key records only a write: a refusal changed nothing, and
            // sent again it is decided again.
            _ if !callers => {}
            // Nothing was written, so nothing recorded the answer: it is recorded on its own.
            // Should a duplicate have recorded the key meanwhile, its answer is the one.
            _ => {
                let response = stored(outcome.as_ref(), request_id, keyed.instance);
                if !store.record_refusal(keyed.request, &response)? && attempts < KEYED_LOOKUPS {
                    continue;
                }
            }
        }
        return Ok(outcome_response(&outcome, request_id, keyed.instance));
    }
}

/// An operation carried out in the cell `home` (for a VM, in whichever cell has it), with
/// whether the write recorded the answer under the key.
fn carried_out(
    operation: &Operation,
    stores: &CellStores<'_>,
    home: Cell,
    context: &Context<'_>,
    keyed: Option<&Keyed<'_>>,
) -> Result<(Reply, bool), Problem> {
    let Home::Vm(id) = operation.home() else {
        return Ok(write(operation, stores, home, context, keyed)?);
    };
    let mut cells = stores.cells_for_vm(id);
    let first = write(
        operation,
        stores,
        cells.next().unwrap_or(home),
        context,
        keyed,
    );
    if !first.as_ref().is_err_and(StoreError::is_not_found) {
        return Ok(first?);
    }
    for cell in cells {
        let elsewhere = write(operation, stores, cell, context, keyed);
        if !elsewhere.as_ref().is_err_and(StoreError::is_not_found) {
            return Ok(elsewhere?);
        }
    }
    Ok(first?)
}

/// An operation carried out in the store of `cell`: refused where that database may be a
/// read replica, prepared once, then planned from fresh facts and answered, written with one
/// statement (recording the answer under the request's key), planned again while its facts
/// move (docs/design.md, "The write path"). With whether the answer was recorded.
fn write(
    operation: &Operation,
    stores: &CellStores<'_>,
    cell: Cell,
    context: &Context<'_>,
    keyed: Option<&Keyed<'_>>,
) -> Result<(Reply, bool), StoreError> {
    let store = stores.store(cell);
    if operation.writes() {
        store.writable()?;
    }
    operation.prepare(stores, context)?;
    let mut attempts = WriteAttempts::default();
    loop {
        let planned = match operation.plan(stores.cells(), store, context) {
            Ok(planned) => planned,
            Err(e) => {
                attempts.plan_failed(e)?;
                continue;
            }
        };
        let writes = planned.write.is_some();
        let record = keyed.map(|keyed| {
            let answer = stored(Ok(&planned.outcome), context.request_id, keyed.instance);
            (keyed.request, answer)
        });
        let recorded = writes && record.is_some();
        match store.write(context, planned, record, &mut attempts)? {
            Written::Done(reply) => return Ok((reply, recorded)),
            Written::PlanAgain => {}
        }
    }
}

/// The cell an operation is at home in (docs/design.md, "Cells").
fn home_of(stores: &CellStores<'_>, operation: &Operation) -> Cell {
    match operation.home() {
        Home::Directory => Cell::DIRECTORY,
        Home::Node(id) | Home::Vm(id) => stores.cells().home_of(id),
    }
}

/// Whether the databases of `cells` (those the request reads: its home's, or every cell
/// the bookmark names) have reached the bookmark's positions, waiting for them a while.
fn bookmark_reached(
    stores: &CellStores<'_>,
    wanted: &Positions,
    cells: Option<Cell>,
) -> Result<bool, Problem> {
    for (cell, position) in wanted.past_start() {
        if cells.is_some_and(|only| only != cell) {
            continue;
        }
        if !cell_reached(stores.store(cell), position)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether one cell's database has reached `position`, waiting for it a while; a position
/// ahead of the primary (a database restored from a backup older than the bookmark) is
/// refused at once.
fn cell_reached(store: &Store<'_>, position: i64) -> Result<bool, Problem> {
    match store.bookmark_reach(position)? {
        BookmarkReach::Reached => Ok(true),
        BookmarkReach::NotInTime => Ok(false),
        BookmarkReach::AheadOfThePrimary => Err(Problem::bad_request(
            "invalid-bookmark",
            "the bookmark is ahead of the database: it is not one this API answered with",
        )),
    }
}

/// Gives a successful write's answer its bookmark: the one the request sent, moved up in
/// its home cell to what the write did there (or the cell has reached), and in any other
/// cell it wrote.
fn stamp_bookmark(
    response: &mut Response,
    seal: &BookmarkSeal,
    stores: &CellStores<'_>,
    home: Cell,
    sent: Option<&Positions>,
) -> Result<(), Problem> {
    if !(200..300).contains(response.status()) {
        return Ok(());
    }
    let mut at = sent
        .cloned()
        .unwrap_or_else(|| Positions::start(stores.cells()));
    at.advance(home, stores.store(home).bookmark_position()?);
    for (cell, store) in stores.all() {
        at.advance(cell, store.seen_position());
    }
    response.set_header(BOOKMARK_HEADER, seal.format(&at, stores.cells()));
    Ok(())
}

/// The cell of the node or VM the path names, for a route at home there.
fn cell_named_by_path(
    stores: &CellStores<'_>,
    home: routes::Home,
    params: &PathParams,
) -> Option<Cell> {
    let named = match home {
        routes::Home::NodeInPath => params.get("nodeId")?,
        routes::Home::VmInPath => params.get("id")?,
        routes::Home::Directory | routes::Home::NodeInBody => return None,
    };
    Some(stores.cells().home_of(named))
}

/// A write at an app that is not its home (docs/design.md, "Writes at home"): sent whole to
/// the home, which authenticates it and runs it beside the primaries, and answered as the home
/// answered once this site's copy has what it wrote. The body is read first, within the
/// endpoint's limit and the deadline, so that a lost answer can be asked again.
fn write_at_home(
    home: &HomeApp,
    head: &Head<'_>,
    body: UnreadBody,
    endpoint: Endpoint,
    ids: &RequestIds,
    config: &AppConfig,
    sent: Option<&SentBookmark>,
) -> Result<Response, Problem> {
    let audit_key = config.audit_key.as_bytes();
    if forward::arrival(head.request, audit_key).is_some() {
        return Err(forward::loop_refused());
    }
    // An Idempotency-Key sent twice, or not of the allowed form, is refused here as at home:
    // the home would see only one of the values.
    idempotency_key(head.request, head.repeated_headers)?;
    let body = body.read(endpoint.max_body, config.body_deadline_ms)?;
    request_log::forwarded(Forwarded::ToHome);
    let forwarded = forward::forward(home, head.request, &body, &ids.server, audit_key)?;
    if forwarded.sends > 1 {
        eprintln!(
            "request {}: its answer was lost {} times on the way from the home",
            ids.server,
            forwarded.sends - 1
        );
    }
    if let Some(answered) = &forwarded.bookmark {
        copy_reaches(config, answered, sent);
    }
    Ok(forwarded.response)
}

/// Waits until this site's copy of each cell a forwarded write moved has the position the
/// home answered (read-your-writes at a site). A copy cut off from its primary is not waited
/// for past [`reservations_store::site::COPY_REACHES_WRITE_WITHIN`]: the write is done, and
/// its bookmark says so.
fn copy_reaches(config: &AppConfig, answered: &str, sent: Option<&SentBookmark>) {
    let seal = BookmarkSeal::new(config.audit_key.as_bytes());
    let Some(wanted) = bookmark::opened(&seal, answered, config.cells) else {
        return;
    };
    let before = sent
        .and_then(|sent| seal.open(sent, config.cells).ok())
        .unwrap_or_else(|| Positions::start(config.cells));
    let bucket = crate::config::DefaultBucket::default();
    for (cell, position) in wanted.past_start() {
        if before.get(cell) >= position {
            continue;
        }
        let label = cell.label();
        let db = SpinDb::open(&label);
        let reached = Store::keyed(&db, config.audit_key.as_bytes())
            .map(|store| store.remembering_its_site(&bucket, &config.remembered_as(&label)))
            .and_then(|store| store.await_copy(position));
        match reached {
            Ok(true) => {}
            Ok(false) => eprintln!(
                "the copy of {label} did not reach the forwarded write at position {position}"
            ),
            Err(e) => eprintln!("the copy of {label} could not be read after a write: {e}"),
        }
    }
}

/// The bearer token a request sent, the app's secrets to check it against, and the
/// `Bookmark` it sent (its seal checked once the caller is known).
struct Credentials<'a> {
    token: &'a str,
    config: &'a AppConfig,
    bookmark: Option<SentBookmark>,
}

/// A request that carries a bookmark may come from a client that made its key a moment ago
/// at another site, which this site's copy of the database has not reached yet: at a
/// replica its key is looked for again, at the copy, for as long as a bookmark is waited for,
/// and if it never appears the first refusal is the answer. Nothing is compared with the
/// bookmark before the caller is known, so a stranger learns nothing from it: whatever
/// bookmark it sends, it waits as long and gets the same 401.
fn authenticate_as_the_copy_catches_up(
    store: &Store<'_>,
    token: &str,
    config: &AppConfig,
    refused: Problem,
) -> Result<Caller, Problem> {
    let Some(mut wait) = store.wait_for_the_copy() else {
        return Err(refused);
    };
    while wait.pause() {
        match authenticate(store, token, &config.operator_token) {
            Ok(caller) => return Ok(caller),
            Err(problem) if problem.status == 401 => {}
            Err(problem) => return Err(problem),
        }
    }
    Err(refused)
}

/// Admits a waiting request of `token` if fewer than `limit` of its are running; 429
/// `too-many-waits` otherwise, as when the token's key holds all its places.
fn admit_waiting_request<'a>(
    bucket: &'a crate::config::DefaultBucket,
    token: &str,
    limit: i64,
) -> Result<Option<reservations_store::share::Turn<'a>>, Problem> {
    let token_hash = crate::auth::hash_secret(token);
    reservations_store::share::admit_feed_request(bucket, &token_hash, limit).map_err(|refused| {
        Problem::new(
            429,
            "too-many-waits",
            "Too many waiting polls",
            format!(
                "this token already has {limit} requests of the events feed running; resume with one of them"
            ),
        )
        .with_header("retry-after", refused.retry_after_secs.to_string())
    })
}

// ============================================================================================
// What the idempotency protocol reads and answers
//
// The pieces the idempotency protocol above ([`under_key`]) reads and answers with:
// `Idempotency-Key` read, a recorded answer replayed, a reused key refused, and an answer as
// its record keeps it (see `reservations_store::idempotency`).

pub(crate) const REPLAY_HEADER: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if it sent a valid one.
pub(crate) fn idempotency_key(
    request: &Request,
    repeated_headers: &[&'static str],
) -> Result<Option<String>, Problem> {
    match single_header(request, repeated_headers, "idempotency-key")? {
        None => Ok(None),
        Some(key) if records::is_valid_key(key) => Ok(Some(key.to_owned())),
        Some(_) => Err(Problem::bad_request(
            "invalid-idempotency-key",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )),
    }
}

/// The key a request is carried out under.
pub(crate) enum Key {
    /// The caller's `Idempotency-Key`.
    Callers(String),
    /// The key of the app that forwarded a POST its caller sent without one
    /// (docs/design.md, "Writes at home"): fresh at its first send, used for nothing else, and
    /// looked for only when the request is sent again.
    Forwarders { key: String, resent: bool },
}

impl Key {
    pub(crate) fn text(&self) -> &str {
        match self {
            Key::Callers(key) | Key::Forwarders { key, .. } => key,
        }
    }
}

pub(crate) fn key_reused() -> Problem {
    Problem::new(
        422,
        "idempotency-key-reused",
        "Idempotency-Key reused",
        "this Idempotency-Key was already used with a different request",
    )
}

/// The original response, request id included, so that a replayed problem's `requestId`
/// still matches its header and the audit event's. A response this very request recorded
/// (its commit answered with an error, and the run again found it) is not marked a replay.
pub(crate) fn replay(stored: StoredResponse, request_id: &str) -> Response {
    let StoredResponse {
        status,
        content_type,
        body,
        headers,
    } = stored;
    let original_id = headers
        .iter()
        .find(|(name, _)| name == REQUEST_ID_HEADER)
        .map_or(request_id, |(_, value)| value.as_str());
    let mut builder = json_response(status, &content_type, Some(body), original_id);
    for (name, value) in &headers {
        if name != REQUEST_ID_HEADER {
            builder.header(name.as_str(), value.as_str());
        }
    }
    if original_id != request_id {
        builder.header(REPLAY_HEADER, "true");
    }
    builder.build()
}

/// What identifies the target of a request for idempotency, and what a forwarded one is sent
/// to: its path and query, not the full URI, whose authority names whichever replica (or
/// port, after a restart) took it.
pub(crate) fn path_and_query(request: &Request) -> String {
    match request.query() {
        "" => request.path().to_owned(),
        query => format!("{}?{query}", request.path()),
    }
}

/// What the record keeps of an answer.
pub(crate) fn stored(
    outcome: Result<&Reply, &Problem>,
    request_id: &str,
    instance: &str,
) -> StoredResponse {
    let mut headers = vec![(REQUEST_ID_HEADER.to_owned(), request_id.to_owned())];
    match outcome {
        Ok(reply) => {
            headers.extend(
                reply
                    .headers
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), value.clone())),
            );
            StoredResponse {
                status: reply.status,
                content_type: "application/json".to_owned(),
                body: reply.as_recorded().unwrap_or_default(),
                headers,
            }
        }
        Err(problem) => StoredResponse {
            status: problem.status,
            content_type: PROBLEM_CONTENT_TYPE.to_owned(),
            body: problem.body(request_id, instance).to_string(),
            headers,
        },
    }
}
