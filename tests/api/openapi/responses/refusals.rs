//! What every route refuses alike: strangers, bad keys, bodies that never arrive.

use super::*;

/// Every authenticated operation: 401 with the Bearer challenge for an unknown token, and
/// 400 for an Idempotency-Key that is not 1-255 visible ASCII characters.
pub(super) fn strangers_and_bad_keys_are_refused_everywhere(cast: &Cast<'_>) {
    let Cast {
        operator,
        app,
        spec,
        ..
    } = cast;
    let forged = spec.caller(app.client("gpr.key-0000.0000"));
    let bad_key = operator.with_header("idempotency-key", "not valid");
    let seen = spec.seen();
    let operations: BTreeSet<(String, String)> = seen
        .iter()
        .filter(|(_, template, _)| template != "/v1/healthz" && template != "/v1/openapi.json")
        .map(|(method, template, _)| (method.clone(), template.clone()))
        .collect();
    for (method, template) in &operations {
        let path = template
            .split('/')
            .map(|s| if s.starts_with('{') { "x1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let reply = forged.send(method, &path, Some("application/json"), Some(b"{}"));
        assert!(
            reply
                .header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")),
            "{method} {path}: 401 without the Bearer challenge"
        );
        reply.expect_problem(401, "unauthorized");
        bad_key
            .send(method, &path, Some("application/json"), Some(b"{}"))
            .expect_problem(400, "invalid-idempotency-key");
    }
}

/// Every operation that takes a body: 408 when the body does not arrive in time.
pub(super) fn bodies_that_never_arrive_time_out_everywhere(cast: &Cast<'_>) {
    let Cast { app, spec, .. } = cast;
    let slow: Vec<(String, String)> = spec
        .documented_responses()
        .into_iter()
        .filter(|(_, _, status)| *status == 408)
        .map(|(method, template, _)| (method, template))
        .collect();
    std::thread::scope(|scope| {
        for (method, template) in &slow {
            let (app, spec) = (&app, &spec);
            scope.spawn(move || {
                let path = template
                    .split('/')
                    .map(|s| if s.starts_with('{') { "x1" } else { s })
                    .collect::<Vec<_>>()
                    .join("/");
                let answer = body_never_finished(app, method, &path);
                assert!(
                    answer.starts_with("HTTP/1.1 408")
                        && answer.contains("application/problem+json")
                        && answer.contains("\"code\":\"request-timeout\""),
                    "{method} {path}: {answer}"
                );
                spec.contract.record(method, template, 408);
            });
        }
    });
}

/// Sends the operator's `method path` with a body that never finishes arriving, and returns
/// the server's answer.
pub(super) fn body_never_finished(app: &App, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let address = app.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OPERATOR_TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: 10\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).expect("send");
    // The head and the body may come in separate reads: read until the whole answer is in.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    while !is_whole_answer(&answer) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether `answer` holds an HTTP head and its whole body.
pub(super) fn is_whole_answer(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    match length {
        Some(length) => body.len() >= length,
        // Chunked: the last chunk is empty.
        None => body.ends_with("0\r\n\r\n"),
    }
}
