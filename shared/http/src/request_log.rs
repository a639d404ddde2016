//! One log record per request (docs/design.md, "What an operator sees"): a JSON line on the
//! component's stdout, which `spin up` (and the project's host) keep in the component's log
//! file and export as an OpenTelemetry log record. It names the request, its route and
//! answer, the caller's org (never a token or a key's secret), the cell it was at home in,
//! whether it was forwarded, and what it cost (see [`reservations_store::storage::Tally`]).
//!
//! The Spin variable `request_log` sets how much is written: `all` (the default), `errors`
//! (answers of 500 and above, and any refusal a problem names) or `none`.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use reservations_domain::access::Caller;

use serde_json::json;
use spin_sdk::http::Response;

use crate::routes::REQUEST_ID_HEADER;

/// What the request's path noted on the way.
#[derive(Default)]
struct Noted {
    org: Option<String>,
    operator: bool,
    cell: Option<String>,
    forwarded: Option<Forwarded>,
    code: Option<&'static str>,
}

/// Which way a write was forwarded (docs/design.md, "Writes at home").
#[derive(Clone, Copy)]
pub enum Forwarded {
    /// Sent from this site to its home.
    ToHome,
    /// Arrived here, at home, from a site.
    FromSite,
}

thread_local! {
    static NOTED: RefCell<Noted> = RefCell::new(Noted::default());
}

fn note(change: impl FnOnce(&mut Noted)) {
    NOTED.with(|noted| change(&mut noted.borrow_mut()));
}

pub fn caller(caller: &Caller) {
    note(|n| {
        n.org = caller.org_id.clone();
        n.operator = caller.org_id.is_none();
    });
}

pub fn home_cell(label: String) {
    note(|n| n.cell = Some(label));
}

pub fn forwarded(way: Forwarded) {
    note(|n| n.forwarded = Some(way));
}

pub fn problem(code: &'static str) {
    note(|n| n.code = Some(code));
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    All,
    Errors,
    None,
}

fn level() -> Level {
    match spin_sdk::variables::get("request_log").as_deref() {
        Ok("none") => Level::None,
        Ok("errors") => Level::Errors,
        _ => Level::All,
    }
}

/// Writes the record of the request just answered, and starts the next one's afresh.
pub fn write(method: &str, route: Option<&str>, path: &str, response: &Response, started: Instant) {
    let noted = NOTED.with(|noted| std::mem::take(&mut *noted.borrow_mut()));
    let tally = reservations_store::storage::Tally::take();
    let status = *response.status();
    let level = level();
    if level == Level::None || (level == Level::Errors && status < 500 && noted.code.is_none()) {
        return;
    }
    let header = |name: &str| {
        response
            .header(name)
            .and_then(|value| value.as_str())
            .map(str::to_owned)
    };
    let forwarded = noted.forwarded.map(|way| match way {
        Forwarded::ToHome => "to-home",
        Forwarded::FromSite => "from-site",
    });
    let ms = |d: Duration| (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0;
    let record = json!({
        "event": "request",
        "request_id": header(REQUEST_ID_HEADER),
        "method": method,
        "route": route.unwrap_or(path),
        "status": status,
        "code": noted.code,
        "org": noted.org,
        "operator": noted.operator,
        "cell": noted.cell,
        "forwarded": forwarded,
        "statements": tally.statements,
        "write_attempts": tally.write_attempts,
        "copy_wait_ms": ms(tally.copy_wait),
        "share_wait_ms": ms(tally.share_wait),
        "bookmark": header("bookmark"),
        "duration_ms": ms(started.elapsed()),
    });
    println!("{record}");
}
