//! Hostile input: every body-taking endpoint and every path parameter, fed raw bytes and
//! structured mutations (truncations, invalid UTF-8, control bytes, unknown, missing,
//! duplicated and mistyped fields, SQL metacharacters in every string field, deep nesting,
//! huge arrays, bodies just over and exactly at the limits, wrong content types), ids with
//! `..`, `/`, `%2F`, `%00`, unicode, 10 KB and SQL in them, hostile query strings and headers,
//! and malformed HTTP. Every answer must be a 4xx (a problem document whenever the request
//! reached the app), never a 5xx or a dropped connection, and the database and the key-value
//! store must be byte-for-byte what they were before.
//!
//! The generator is seeded (`HOSTILE_SEED=<n>` replays a run). Each endpoint is aimed at a
//! target that refuses even a well-formed body (an org id that is taken, an org that does not
//! exist, a cancelled reservation…), so no input can change anything by being accidentally
//! valid: whatever changes, the parser or a check let something through.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{Map, Value, json};

use reservations_http::routes::{Kind, Method, ROUTES, Route};

use api_support::fuzz::{
    Expect, Fuzz, SQL_METACHARACTERS, assert_unchanged, hostile_ids, insert_byte, snapshot,
    with_connection_close, with_leading_member, wrong_type,
};
use api_support::random::{Rng, scale, seed};
use api_support::{App, OPERATOR_TOKEN, ReservationSpec, Scenario, Scene, rfc3339_from_now};

mod bodies;
mod requests;

use bodies::{attack_body_parser, attack_randomly, attack_unit_lists};
use requests::{attack_http_framing, attack_path_parameters, attack_queries_and_headers};

/// What one endpoint parses, and a body it refuses even when well-formed.
struct BodyEndpoint {
    name: &'static str,
    method: &'static str,
    /// Its route in the table, whose limit it has.
    pattern: &'static str,
    path: String,
    token: String,
    refused_body: Value,
    /// The status and code that `refused_body` gets, stated here rather than read from a
    /// reply: every body the parser must accept (at the size limit, with a charset) has to
    /// reach this very refusal, so a parser that refused it would be seen.
    refusal: (u16, &'static str),
    /// (field, is a list of strings, required)
    fields: &'static [(&'static str, bool, bool)],
}

impl BodyEndpoint {
    /// Sends `body` to the endpoint as its own caller, expecting `expect`.
    fn hit(
        &self,
        fuzz: &mut Fuzz,
        what: &str,
        content_type: Option<&str>,
        body: &[u8],
        expect: Expect,
    ) {
        fuzz.attack(
            &format!("{} {what}", self.name),
            &self.token,
            self.method,
            &self.path,
            content_type,
            Some(body),
            expect,
        );
    }

    /// Parsed, and refused by the target's state exactly as the well-formed body is.
    fn parsed(&self) -> Expect {
        Expect::Problem(self.refusal.0, Some(self.refusal.1))
    }

    /// The largest body the route table lets this endpoint take.
    fn limit(&self) -> usize {
        match table_route(self.method, self.pattern).kind {
            Kind::Authenticated(endpoint) => endpoint.max_body,
            other => panic!("{} {} is a {other:?} route", self.method, self.pattern),
        }
    }
}

/// Body-taking routes the fuzzer leaves alone, and why.
const NOT_FUZZED: &[(&str, &str, &str)] = &[(
    "POST",
    "/v1/operator/keys",
    "every well-formed body is accepted, so no target refuses what a mutation makes valid",
)];

/// Every body-taking route of the table is fuzzed through one of `endpoints`, or named in
/// [`NOT_FUZZED`].
fn assert_every_body_is_fuzzed(endpoints: &[BodyEndpoint]) {
    for route in ROUTES.iter().filter(|r| {
        matches!(r.kind, Kind::Authenticated(_)) && matches!(r.method, Method::Post | Method::Put)
    }) {
        let (method, pattern) = (route.method.as_str(), route.pattern);
        let fuzzed = endpoints
            .iter()
            .any(|e| (e.method, e.pattern) == (method, pattern));
        let excused = NOT_FUZZED
            .iter()
            .any(|(m, p, _)| (*m, *p) == (method, pattern));
        assert!(
            fuzzed != excused,
            "{method} {pattern}: fuzzed {fuzzed}, excused {excused}"
        );
    }
}

/// The market under attack: orgs, a node, an active reservation `R` and a cancelled one `C`.
struct Market {
    app: App,
    member: String,
    active: String,
    cancelled: String,
}

fn market() -> Market {
    let scene = Scenario::new()
        .orgs(&["owner", "tenant"])
        .node("n0", "owner", &["g0", "g1", "g2", "g3"])
        .reservation(
            "active",
            ReservationSpec::on("n0", &["g0", "g1"]).audience(&["tenant"]),
        )
        .reservation(
            "cancelled",
            ReservationSpec::on("n0", &["g2"]).audience(&["tenant"]),
        )
        .cancel("cancelled")
        .key("member", "tenant", "member")
        .open();
    let Scene { app, fixtures } = scene;
    // Touch the health probe once, so that its key exists before the snapshot.
    app.anonymous().get("/v1/healthz").expect_status(200);
    Market {
        app,
        member: fixtures.token("member"),
        active: fixtures.reservation_id("active"),
        cancelled: fixtures.reservation_id("cancelled"),
    }
}

fn endpoints(market: &Market) -> Vec<BodyEndpoint> {
    let operator = OPERATOR_TOKEN.to_owned();
    let capacity = |name: &'static str, pattern: &'static str| BodyEndpoint {
        name,
        method: "POST",
        pattern,
        path: fill(pattern, &market.active),
        token: operator.clone(),
        refused_body: json!({ "unitIds": ["not-a-unit"], "reason": "r" }),
        refusal: (422, "units-not-in-reservation"),
        fields: &[("unitIds", true, true), ("reason", false, false)],
    };
    vec![
        BodyEndpoint {
            name: "create org",
            method: "POST",
            pattern: "/v1/orgs",
            path: "/v1/orgs".into(),
            token: operator.clone(),
            // The id is taken.
            refused_body: json!({ "id": "owner", "name": "Owner again" }),
            refusal: (409, "already-exists"),
            fields: &[("id", false, false), ("name", false, true)],
        },
        BodyEndpoint {
            name: "create key",
            method: "POST",
            pattern: "/v1/orgs/:orgId/keys",
            path: "/v1/orgs/no-such-org/keys".into(),
            token: operator.clone(),
            refused_body: json!({ "name": "k", "role": "viewer", "permissions": ["node.read"] }),
            refusal: (404, "not-found"),
            fields: &[
                ("name", false, true),
                ("role", false, true),
                ("permissions", true, false),
            ],
        },
        BodyEndpoint {
            name: "put node",
            method: "PUT",
            pattern: "/v1/nodes/:nodeId",
            path: "/v1/nodes/n0".into(),
            token: operator.clone(),
            refused_body: json!({ "ownerOrgId": "no-such-org", "unitIds": ["g0", "g1"] }),
            refusal: (422, "unknown-orgs"),
            fields: &[("ownerOrgId", false, true), ("unitIds", true, true)],
        },
        BodyEndpoint {
            name: "create reservation",
            method: "POST",
            pattern: "/v1/nodes/:nodeId/reservations",
            path: "/v1/nodes/n0/reservations".into(),
            token: operator.clone(),
            refused_body: json!({
                "reservedUnitIds": ["g3"],
                "allowedOrgIds": ["no-such-org"],
                "managingOrgIds": [],
                "startsAt": rfc3339_from_now(-60),
                "endsAt": rfc3339_from_now(3600),
                "contractRef": "c-1",
                "reason": "r",
            }),
            refusal: (422, "unknown-orgs"),
            fields: &[
                ("reservedUnitIds", true, true),
                ("allowedOrgIds", true, true),
                ("managingOrgIds", true, false),
                ("startsAt", false, true),
                ("endsAt", false, false),
                ("contractRef", false, false),
                ("reason", false, false),
            ],
        },
        BodyEndpoint {
            name: "cancel reservation",
            method: "POST",
            pattern: "/v1/nodes/:nodeId/reservations/:id/cancel",
            path: format!("/v1/nodes/n0/reservations/{}/cancel", market.cancelled),
            token: operator.clone(),
            refused_body: json!({ "reason": "r" }),
            refusal: (409, "reservation-final"),
            fields: &[("reason", false, false)],
        },
        BodyEndpoint {
            name: "reaffirm reservation",
            method: "POST",
            pattern: "/v1/nodes/:nodeId/reservations/:id/reaffirm",
            path: format!("/v1/nodes/n0/reservations/{}/reaffirm", market.cancelled),
            token: operator.clone(),
            refused_body: json!({ "reservedUnitIds": ["g2"], "reason": "r" }),
            refusal: (409, "reservation-not-needs-review"),
            fields: &[("reservedUnitIds", true, false), ("reason", false, false)],
        },
        capacity("release", "/v1/nodes/:nodeId/reservations/:id/release"),
        capacity("reclaim", "/v1/nodes/:nodeId/reservations/:id/reclaim"),
        capacity(
            "dry run",
            "/v1/nodes/:nodeId/reservations/:id/reclaim/dry-run",
        ),
        BodyEndpoint {
            name: "place VM",
            method: "POST",
            pattern: "/v1/vms",
            path: "/v1/vms".into(),
            token: market.member.clone(),
            refused_body: json!({ "nodeId": "no-such-node", "unitIds": ["g0"], "tier": "spot" }),
            refusal: (404, "not-found"),
            fields: &[
                ("nodeId", false, true),
                ("unitIds", true, true),
                ("tier", false, true),
            ],
        },
    ]
}

fn table_route(method: &str, pattern: &str) -> &'static Route {
    ROUTES
        .iter()
        .find(|r| r.method.as_str() == method && r.pattern == pattern)
        .unwrap_or_else(|| panic!("the route table has no {method} {pattern}"))
}

/// A reservation's path under `pattern`: node `n0`, reservation `reservation`.
fn fill(pattern: &str, reservation: &str) -> String {
    pattern.replace(":nodeId", "n0").replace(":id", reservation)
}

const JSON: Option<&str> = Some("application/json");

#[test]
fn hostile_input_is_refused_with_a_problem_and_changes_nothing() {
    let market = market();
    let mut rng = Rng::new(seed("HOSTILE_SEED"));
    let before = snapshot(&market.app);
    let mut fuzz = Fuzz::new(&market.app.base);
    for endpoint in endpoints(&market) {
        attack_body_parser(&mut fuzz, &endpoint, &mut rng);
        attack_unit_lists(&mut fuzz, &endpoint);
    }
    attack_path_parameters(&mut fuzz, &market);
    attack_queries_and_headers(&mut fuzz, &market);
    attack_http_framing(&mut fuzz);
    // Soak: `HOSTILE_INPUTS=<n>` (1000000) goes on with random inputs until n were tried.
    let inputs = scale("HOSTILE_INPUTS", 0);
    let endpoints = endpoints(&market);
    assert_every_body_is_fuzzed(&endpoints);
    while fuzz.tried < inputs {
        for endpoint in &endpoints {
            attack_randomly(&mut fuzz, endpoint, &mut rng);
        }
    }
    println!(
        "hostile: {} inputs tried, answers by status {:?}, {} failures",
        fuzz.tried,
        fuzz.by_status,
        fuzz.failures.len()
    );
    assert!(
        fuzz.failures.is_empty(),
        "{} hostile inputs were not refused properly:\n{}",
        fuzz.failures.len(),
        fuzz.failures
            .iter()
            .take(60)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_unchanged(&before, &snapshot(&market.app));
    // The app still works.
    market.app.anonymous().get("/v1/healthz").expect_status(200);
}

/// Free text is data, never SQL: names, reasons and contract references full of SQL
/// metacharacters are stored and returned byte for byte, and the schema is untouched.
#[test]
fn sql_metacharacters_in_free_text_are_stored_verbatim() {
    let market = market();
    let schema_before = snapshot(&market.app)["sqlite_master"].clone();
    let operator = market.app.operator();
    for (i, text) in SQL_METACHARACTERS.iter().enumerate() {
        let org = operator
            .post(
                "/v1/orgs",
                &json!({ "id": format!("sql-{i}"), "name": text }),
            )
            .expect_status(201)
            .json();
        assert_eq!(org["name"], *text);
        let read = operator
            .get(&format!("/v1/orgs/sql-{i}"))
            .expect_status(200)
            .json();
        assert_eq!(read["name"], *text);
    }
    let reservation = operator
        .post(
            "/v1/nodes/n0/reservations",
            &json!({
                "reservedUnitIds": ["g3"],
                "allowedOrgIds": ["tenant"],
                "startsAt": rfc3339_from_now(-60),
                "contractRef": SQL_METACHARACTERS[1],
                "reason": SQL_METACHARACTERS[2],
            }),
        )
        .expect_status(201)
        .json();
    assert_eq!(reservation["contractRef"], SQL_METACHARACTERS[1]);
    assert_eq!(reservation["reason"], SQL_METACHARACTERS[2]);
    let id = reservation["id"].as_str().unwrap();
    operator
        .post(
            &format!("/v1/nodes/n0/reservations/{id}/release"),
            &json!({ "unitIds": ["g3"], "reason": SQL_METACHARACTERS[0] }),
        )
        .expect_status(200);
    let events = operator
        .get(&format!(
            "/v1/audit?reservationId={id}&action=reservation.release"
        ))
        .expect_status(200)
        .json();
    assert_eq!(events["items"][0]["reason"], SQL_METACHARACTERS[0]);
    assert_eq!(snapshot(&market.app)["sqlite_master"], schema_before);
    let verification = operator.get("/v1/audit/verify").expect_status(200).json();
    assert_eq!(verification["ok"], true);
}
