//! Hostile request bodies: syntax, fields, shapes, sizes and content types, unit lists, and random
//! bytes, against every endpoint that takes a body.

use super::*;

/// Every mutation of one endpoint's body; all must be refused.
pub(super) fn attack_body_parser(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
    attack_syntax(fuzz, endpoint, rng);
    attack_fields(fuzz, endpoint, rng);
    attack_shapes(fuzz, endpoint, rng);
    attack_sizes_and_content_types(fuzz, endpoint);
}

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
        // Another convention than plain JSON, however JSON its syntax.
        Some("application/merge-patch+json"),
        Some("application/vnd.api+json"),
        Some("application/problem+json"),
        Some("application/x-evil+json"),
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
        "JSON with a charset",
        Some("Application/JSON; charset=utf-8"),
        body.as_bytes(),
        endpoint.parsed(),
    );
}

/// Random inputs only (for soak runs): truncations of the well-formed body, which are never
/// a complete JSON value, and random bytes and JSON-ish noise, which must be refused.
pub(super) fn attack_randomly(fuzz: &mut Fuzz, endpoint: &BodyEndpoint, rng: &mut Rng) {
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
pub(super) fn attack_unit_lists(fuzz: &mut Fuzz, endpoint: &BodyEndpoint) {
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
