//! Hostile requests around the body: path parameters, queries and headers, and HTTP framing.

use super::*;

/// Routes with ids in their path, and a body that would succeed with real ids: only the id
/// check stands between such a request and a change.
pub(super) fn attack_path_parameters(fuzz: &mut Fuzz, market: &Market) {
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
pub(super) fn attack_queries_and_headers(fuzz: &mut Fuzz, market: &Market) {
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
pub(super) fn attack_http_framing(fuzz: &mut Fuzz) {
    let address = fuzz.base.trim_start_matches("http://").to_owned();
    let exchange = |request: &[u8]| {
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        // No half-close: like hyper's default, Spin drops a connection whose client shuts its
        // side mid-request. `Connection: close` ends the exchange instead.
        let _ = stream.write_all(&with_connection_close(request));
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    // (request, a problem code the answer must carry when the request reaches the app)
    let requests: Vec<(Vec<u8>, Option<&str>)> = vec![
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
        let text = exchange(request);
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
    // A header value that is not UTF-8 never reaches the app: Spin fails the request before
    // the component runs, with a 500 and no body.
    fuzz.tried += 1;
    let text =
        exchange(b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !(head.starts_with("HTTP/1.1 500 ") && head.contains("content-length: 0") && body.is_empty())
    {
        fuzz.failures.push(format!(
            "a header value that is not UTF-8: answered {:?}",
            text.chars().take(200).collect::<String>()
        ));
    }
}
