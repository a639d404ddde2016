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
    /// reply: every body the parser must accept (at the size limit, a `+json` type, a
    /// charset) has to reach this very refusal, so a parser that refused it would be seen.
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

/// Every mutation of one endpoint's body; all must be refused.
fn attack_body_parser(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    attack_syntax(fuzz, endpoint, rng);
    attack_fields(fuzz, endpoint, rng);
    attack_shapes(fuzz, endpoint, rng);
    attack_sizes_and_content_types(fuzz, endpoint);
}

const JSON: Option<&str> = Some("application/json");

fn bad_request(code: &'static str) -> Expect {
    Expect::Problem(400, Some(code))
}

/// The refused body, cut short, with bytes that are never valid there, with something after
/// it, with a field the endpoint does not know.
fn attack_syntax(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    let body = endpoint.refused_body.to_string();
    // The well-formed body itself is refused by the target's state.
    endpoint.hit(
        fuzz,
        "refused body",
        JSON,
        body.as_bytes(),
        endpoint.parsed(),
    );
    // Truncated anywhere (an empty body included): never a complete JSON value.
    for cut in [0, 1, body.len() / 2, body.len() - 1] {
        endpoint.hit(
            fuzz,
            "truncated",
            JSON,
            &body.as_bytes()[..cut],
            bad_request("malformed-json"),
        );
    }
    for _ in 0..8 {
        let cut = rng.below(body.len());
        endpoint.hit(
            fuzz,
            "truncated",
            JSON,
            &body.as_bytes()[..cut],
            bad_request("malformed-json"),
        );
    }
    // Bytes that are never valid there: invalid UTF-8, control characters.
    for _ in 0..8 {
        let byte = 0x80 + rng.below(0x80) as u8;
        endpoint.hit(
            fuzz,
            "invalid UTF-8",
            JSON,
            &insert_byte(&body, rng, byte),
            Expect::Problem(400, None),
        );
    }
    for _ in 0..6 {
        let byte = *rng.pick(&[0x00u8, 0x01, 0x07, 0x08, 0x0B, 0x0C, 0x1B, 0x1F]);
        endpoint.hit(
            fuzz,
            "control byte",
            JSON,
            &insert_byte(&body, rng, byte),
            Expect::Problem(400, None),
        );
    }
    endpoint.hit(
        fuzz,
        "trailing garbage",
        JSON,
        format!("{body}x").as_bytes(),
        bad_request("malformed-json"),
    );
    endpoint.hit(
        fuzz,
        "two values",
        JSON,
        format!("{body}{body}").as_bytes(),
        bad_request("malformed-json"),
    );
    endpoint.hit(
        fuzz,
        "unknown field",
        JSON,
        with_leading_member(&body, "zz", "1").as_bytes(),
        bad_request("unknown-field"),
    );
    endpoint.hit(
        fuzz,
        "unknown field, SQL name",
        JSON,
        with_leading_member(&body, "id\\\"; DROP TABLE orgs; --", "1").as_bytes(),
        bad_request("unknown-field"),
    );
}

/// Each field of the wrong type, missing, null, twice, and with SQL metacharacters.
fn attack_fields(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    let body = endpoint.refused_body.to_string();
    for (field, is_list, required) in endpoint.fields {
        let mut object: Map<String, Value> = endpoint
            .refused_body
            .as_object()
            .expect("an object")
            .clone();
        for _ in 0..3 {
            object.insert((*field).into(), wrong_type(rng, *is_list));
            endpoint.hit(
                fuzz,
                &format!("{field} of the wrong type"),
                JSON,
                Value::Object(object.clone()).to_string().as_bytes(),
                Expect::Problem(400, None),
            );
        }
        if *required {
            object.remove(*field);
            endpoint.hit(
                fuzz,
                &format!("{field} missing"),
                JSON,
                Value::Object(object.clone()).to_string().as_bytes(),
                bad_request("missing-field"),
            );
            object.insert((*field).into(), Value::Null);
            endpoint.hit(
                fuzz,
                &format!("{field} null"),
                JSON,
                Value::Object(object.clone()).to_string().as_bytes(),
                Expect::Problem(400, None),
            );
        }
        let original = endpoint.refused_body[*field].to_string();
        endpoint.hit(
            fuzz,
            &format!("{field} twice"),
            JSON,
            with_leading_member(&body, field, &original).as_bytes(),
            Expect::Problem(400, None),
        );
        // SQL metacharacters in the field (in each element, for a list).
        for text in SQL_METACHARACTERS {
            let mut object = endpoint.refused_body.as_object().unwrap().clone();
            object.insert(
                (*field).into(),
                if *is_list {
                    json!([text, "g0"])
                } else {
                    json!(text)
                },
            );
            endpoint.hit(
                fuzz,
                &format!("{field} with SQL"),
                JSON,
                Value::Object(object).to_string().as_bytes(),
                Expect::Refused,
            );
        }
    }
}

/// Bodies that are not an object, random bytes, nesting deep enough to meet the parser's
/// recursion limit.
fn attack_shapes(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    // Not an object at all.
    for other in [
        "[]", "[1]", "\"x\"", "1", "null", "true", "{\"a\":}", "{,}", "{'a':1}",
    ] {
        endpoint.hit(
            fuzz,
            "not an object",
            JSON,
            other.as_bytes(),
            Expect::Refused,
        );
    }
    // Random bytes, and random printable noise.
    for _ in 0..12 {
        let len = rng.below(300);
        let noise: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        endpoint.hit(fuzz, "random bytes", JSON, &noise, Expect::Refused);
    }
    for _ in 0..6 {
        let len = 1 + rng.below(300);
        let noise: Vec<u8> = (0..len)
            .map(|_| b"{}[]\":,0123456789.eE+-tfnul \\abc"[rng.below(32)])
            .collect();
        endpoint.hit(fuzz, "random JSON-ish noise", JSON, &noise, Expect::Refused);
    }
    // Deep nesting, within the size limit (the parser's recursion limit, not the size, refuses).
    let depth = (endpoint.limit() - 64).min(100_000);
    endpoint.hit(
        fuzz,
        "deeply nested arrays",
        JSON,
        "[".repeat(depth).as_bytes(),
        Expect::Problem(400, None),
    );
    let first_field = endpoint.fields[0].0;
    let nested = format!(
        "{{\"{first_field}\":{}",
        "[".repeat(depth - first_field.len() - 8)
    );
    endpoint.hit(
        fuzz,
        "a deeply nested field",
        JSON,
        nested.as_bytes(),
        Expect::Problem(400, None),
    );
    let objects = "{\"a\":".repeat((depth / 6).min(20_000));
    endpoint.hit(
        fuzz,
        "deeply nested objects",
        JSON,
        objects.as_bytes(),
        Expect::Problem(400, None),
    );
}

/// Exactly at the size limit and one byte over; wrong, missing and other JSON content types.
fn attack_sizes_and_content_types(fuzz: &mut Fuzz, endpoint: &BodyEndpoint) {
    let body = endpoint.refused_body.to_string();
    // Sizes: exactly at the limit is parsed; one byte over is 413.
    let mut at_limit = body.clone().into_bytes();
    at_limit.resize(endpoint.limit(), b' ');
    endpoint.hit(
        fuzz,
        "exactly at the size limit",
        JSON,
        &at_limit,
        endpoint.parsed(),
    );
    at_limit.push(b' ');
    endpoint.hit(
        fuzz,
        "one byte over the size limit",
        JSON,
        &at_limit,
        Expect::Problem(413, Some("payload-too-large")),
    );
    // Wrong or missing content types.
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/xml"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        Some("json"),
        Some(""),
    ] {
        endpoint.hit(
            fuzz,
            "wrong content type",
            content_type,
            body.as_bytes(),
            Expect::Problem(415, Some("unsupported-media-type")),
        );
    }
    endpoint.hit(
        fuzz,
        "JSON by a +json type",
        Some("application/merge-patch+json"),
        body.as_bytes(),
        endpoint.parsed(),
    );
    endpoint.hit(
        fuzz,
        "JSON with a charset",
        Some("Application/JSON; charset=utf-8"),
        body.as_bytes(),
        endpoint.parsed(),
    );
}

/// Random inputs only (for soak runs): truncations of the well-formed body, which are never
/// a complete JSON value, and random bytes and JSON-ish noise, which must be refused.
fn attack_randomly(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    let body = endpoint.refused_body.to_string();
    let json = Some("application/json");
    let name = |what: &str| format!("{} {what}", endpoint.name);
    for _ in 0..8 {
        let cut = rng.below(body.len());
        fuzz.attack(
            &name("truncated"),
            &endpoint.token,
            endpoint.method,
            &endpoint.path,
            json,
            Some(&body.as_bytes()[..cut]),
            Expect::Problem(400, Some("malformed-json")),
        );
    }
    for _ in 0..8 {
        let len = rng.below(300);
        let noise: Vec<u8> = if rng.chance(50) {
            (0..len).map(|_| rng.next_u64() as u8).collect()
        } else {
            (0..len)
                .map(|_| b"{}[]\":,0123456789.eE+-tfnul \\abc"[rng.below(32)])
                .collect()
        };
        fuzz.attack(
            &name("random noise"),
            &endpoint.token,
            endpoint.method,
            &endpoint.path,
            json,
            Some(&noise),
            Expect::Refused,
        );
    }
}

/// Lists of ids: many short ones (within or over the limit), a million, repeats.
fn attack_unit_lists(fuzz: &mut Fuzz, endpoint: &BodyEndpoint) {
    let Some((field, _, _)) = endpoint.fields.iter().find(|(_, is_list, _)| *is_list) else {
        return;
    };
    let with_list = |ids: String| -> Vec<u8> {
        let mut object = endpoint.refused_body.as_object().unwrap().clone();
        object.remove(*field);
        let rest = Value::Object(object).to_string();
        let separator = if rest == "{}" { "" } else { "," };
        format!("{{\"{field}\":[{ids}]{separator}{}", &rest[1..]).into_bytes()
    };
    let json = Some("application/json");
    let name = |what: &str| format!("{} {field}: {what}", endpoint.name);
    // A million ids: for the 8 MB endpoints, parsed and refused by the list's own bound.
    let million = with_list(vec!["\"a\""; 1_000_000].join(","));
    // Refused by the list's own bound, or (re-affirming a cancelled reservation) by its state.
    let expect = if million.len() > endpoint.limit() {
        Expect::Problem(413, Some("payload-too-large"))
    } else {
        Expect::Refused
    };
    fuzz.attack(
        &name("a million ids"),
        &endpoint.token,
        endpoint.method,
        &endpoint.path,
        json,
        Some(&million),
        expect,
    );
    let numbers = with_list(vec!["0"; 1_000_000].join(","));
    let expect = if numbers.len() > endpoint.limit() {
        Expect::Problem(413, Some("payload-too-large"))
    } else {
        Expect::Problem(400, Some("invalid-type"))
    };
    fuzz.attack(
        &name("a million numbers"),
        &endpoint.token,
        endpoint.method,
        &endpoint.path,
        json,
        Some(&numbers),
        expect,
    );
    // As many distinct ids as fit the small limit: more than any request may name.
    let many = with_list(
        (0..9_000)
            .map(|i| format!("\"u{i}\""))
            .collect::<Vec<_>>()
            .join(","),
    );
    fuzz.attack(
        &name("9000 ids"),
        &endpoint.token,
        endpoint.method,
        &endpoint.path,
        json,
        Some(&many),
        Expect::Refused,
    );
    let repeated = with_list(vec!["\"g0\""; 1000].join(","));
    fuzz.attack(
        &name("one id 1000 times"),
        &endpoint.token,
        endpoint.method,
        &endpoint.path,
        json,
        Some(&repeated),
        Expect::Refused,
    );
    let empty = with_list(String::new());
    fuzz.attack(
        &name("no ids"),
        &endpoint.token,
        endpoint.method,
        &endpoint.path,
        json,
        Some(&empty),
        Expect::Refused,
    );
}

/// Routes with ids in their path, and a body that would succeed with real ids: only the id
/// check stands between such a request and a change.
fn attack_path_parameters(fuzz: &mut Fuzz, market: &Market) {
    // Every route of the table with an id in its path, once per id: (method, path template
    // with {} for the hostile id and valid values for the others, token, a well-formed body).
    let routes: Vec<(&str, String, String, Option<Value>)> = ROUTES
        .iter()
        .flat_map(|route| {
            let names = route.pattern.split('/').filter_map(|s| s.strip_prefix(':'));
            names.map(move |hostile| {
                let template: Vec<String> = route
                    .pattern
                    .split('/')
                    .map(|segment| match segment.strip_prefix(':') {
                        Some(name) if name == hostile => "{}".to_owned(),
                        Some(name) => valid_path_value(name, market),
                        None => segment.to_owned(),
                    })
                    .collect();
                let token = match route.pattern.starts_with("/v1/vms") {
                    true => market.member.clone(),
                    false => OPERATOR_TOKEN.to_owned(),
                };
                let body = well_formed_body(route.method, route.pattern);
                (route.method.as_str(), template.join("/"), token, body)
            })
        })
        .collect();
    for id in hostile_ids() {
        for (method, template, token, body) in &routes {
            let path = template.replace("{}", &id);
            let body = body.as_ref().map(|b| b.to_string().into_bytes());
            let content_type = body.as_ref().map(|_| "application/json");
            fuzz.attack(
                "hostile id",
                token,
                method,
                &path,
                content_type,
                body.as_deref(),
                Expect::Refused,
            );
        }
    }
    // A body-taking route whose id is valid, but in a body field of each kind.
    let vm = |field: &str, value: &str| {
        let mut body = json!({ "nodeId": "n0", "unitIds": ["g3"], "tier": "spot" });
        body[field] = if field == "unitIds" {
            json!([value])
        } else {
            json!(value)
        };
        body.to_string().into_bytes()
    };
    for id in hostile_ids() {
        let decoded = id
            .replace("%2F", "/")
            .replace("%00", "\u{0}")
            .replace("%27", "'");
        for field in ["id", "nodeId", "unitIds"] {
            fuzz.attack(
                "hostile id in a body",
                &market.member,
                "POST",
                "/v1/vms",
                Some("application/json"),
                Some(&vm(field, &decoded)),
                Expect::Refused,
            );
        }
    }
}

/// A value of the path parameter `name` that names something that exists.
fn valid_path_value(name: &str, market: &Market) -> String {
    match name {
        "nodeId" => "n0".into(),
        "id" => market.active.clone(),
        "orgId" => "tenant".into(),
        "keyId" => "key-1".into(),
        other => panic!("no valid value known for :{other}"),
    }
}

/// A well-formed body for a route with an id in its path, if it takes one.
fn well_formed_body(method: Method, pattern: &str) -> Option<Value> {
    let capacity = json!({ "unitIds": ["g0"], "reason": "r" });
    match (method, pattern.rsplit('/').next().unwrap_or_default()) {
        (Method::Get | Method::Delete, _) => None,
        (Method::Post, "keys") => Some(json!({ "name": "k", "role": "viewer" })),
        (Method::Put, _) => Some(json!({ "ownerOrgId": "owner", "unitIds": ["g0"] })),
        (Method::Post, "reservations") => Some(json!({
            "reservedUnitIds": ["g3"],
            "allowedOrgIds": ["tenant"],
            "startsAt": rfc3339_from_now(-60),
        })),
        (Method::Post, "cancel" | "reaffirm") => Some(json!({})),
        (Method::Post, "release" | "reclaim" | "dry-run") => Some(capacity),
        (method, last) => panic!("no well-formed body known for {method:?} …/{last}"),
    }
}

/// Query strings of the listings, and headers every request reads.
fn attack_queries_and_headers(fuzz: &mut Fuzz, market: &Market) {
    let lists = [
        "/v1/nodes",
        "/v1/nodes/n0/reservations",
        "/v1/vms",
        "/v1/audit",
        "/v1/orgs/tenant/keys",
        "/v1/market",
    ];
    let queries = [
        "limit=0",
        "limit=-1",
        "limit=99999999999999999999999",
        "limit=1e3",
        "limit=%00",
        "limit=1&limit=2",
        "cursor=%27%20OR%201%3D1%20--&cursor=x",
        "status=%27%20OR%201%3D1%20--",
        "status=%FF",
        "no-such-parameter=1",
        "%FF=1",
        "since=yesterday",
        "until=2026-13-45T99:99:99Z",
        "nodeId=a&nodeId=b",
    ];
    for path in lists {
        for query in queries {
            fuzz.attack(
                "hostile query",
                OPERATOR_TOKEN,
                "GET",
                &format!("{path}?{query}"),
                None,
                None,
                Expect::Refused,
            );
        }
    }
    let release = format!("/v1/nodes/n0/reservations/{}/release", market.active);
    let body = br#"{"unitIds":["g0"]}"#;
    let long_key = "k".repeat(256);
    let bearer = format!("Bearer {OPERATOR_TOKEN}");
    let json_type: &[u8] = b"application/json";
    type Headers<'a> = Vec<(&'a str, Vec<u8>)>;
    let header_sets: Vec<(&str, Headers)> = vec![
        ("no token", vec![]),
        (
            "SQL in the token",
            vec![("authorization", b"Bearer ' OR 1=1 --".to_vec())],
        ),
        (
            "a token of a key that does not exist",
            vec![("authorization", b"Bearer gpr.key-0000.ffff".to_vec())],
        ),
        (
            "a 10 KB token",
            vec![(
                "authorization",
                format!("Bearer {}", "a".repeat(10_240)).into_bytes(),
            )],
        ),
        (
            "Basic auth",
            vec![("authorization", b"Basic b3BlcmF0b3I6eA==".to_vec())],
        ),
        (
            "empty idempotency key",
            vec![
                ("authorization", bearer.clone().into_bytes()),
                ("idempotency-key", Vec::new()),
            ],
        ),
        (
            "256-byte idempotency key",
            vec![
                ("authorization", bearer.clone().into_bytes()),
                ("idempotency-key", long_key.into_bytes()),
            ],
        ),
        (
            "non-ASCII idempotency key",
            vec![
                ("authorization", bearer.clone().into_bytes()),
                ("idempotency-key", b"cl\xc3\xa9".to_vec()),
            ],
        ),
        (
            "idempotency key with a space",
            vec![
                ("authorization", bearer.clone().into_bytes()),
                ("idempotency-key", b"a b".to_vec()),
            ],
        ),
    ];
    for (what, headers) in &header_sets {
        let mut headers: Vec<(&str, &[u8])> =
            headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        headers.push(("content-type", json_type));
        fuzz.attack_with_headers(
            what,
            "POST",
            &release,
            &headers,
            Some(body),
            Expect::Refused,
        );
    }
}

/// Requests hyper itself must refuse, over a raw socket: an answer, not a dropped connection.
fn attack_http_framing(fuzz: &mut Fuzz) {
    let address = fuzz.base.trim_start_matches("http://").to_owned();
    // (request, a problem code the answer must carry when the request reaches the app)
    let requests: Vec<(Vec<u8>, Option<&str>)> = vec![
        (
            b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n".to_vec(),
            Some("unauthorized"),
        ),
        (
            b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: \xc3\xa9\x00\r\n\r\n".to_vec(),
            None,
        ),
        (
            b"GET /v1/nodes/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            None,
        ),
        (
            b"GET /v1/nodes/a b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            None,
        ),
        (
            b"POST /v1/orgs HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(),
            None,
        ),
        (
            b"POST /v1/orgs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello"
                .to_vec(),
            None,
        ),
        // Well-formed headers, then a chunked body that is not: the app cannot read it.
        (
            format!(
                "POST /v1/orgs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            )
            .into_bytes(),
            Some("unreadable-body"),
        ),
        (
            b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n".to_vec(),
            None,
        ),
        (
            [
                b"GET /".as_slice(),
                &vec![b'a'; 1 << 20],
                b" HTTP/1.1\r\nHost: x\r\n\r\n",
            ]
            .concat(),
            None,
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(), None),
    ];
    for (i, (request, code)) in requests.iter().enumerate() {
        fuzz.tried += 1;
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        // No half-close: like hyper's default, Spin drops a connection whose client shuts its
        // side mid-request. `Connection: close` ends the exchange instead.
        let _ = stream.write_all(&with_connection_close(request));
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status: Option<u16> = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok());
        let head: String = text.chars().take(200).collect();
        match status {
            Some(status) if (400..500).contains(&status) => {
                *fuzz.by_status.entry(status).or_default() += 1;
                if let Some(code) = code
                    && !(text.contains("application/problem+json")
                        && text.contains(&format!("\"code\":\"{code}\"")))
                {
                    fuzz.failures.push(format!(
                        "malformed HTTP #{i}: not a {code} problem: {head:?}"
                    ));
                }
            }
            _ => fuzz
                .failures
                .push(format!("malformed HTTP #{i}: answered {head:?}")),
        }
    }
}

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
