//! What reaches a component, over a raw socket: header bytes Spin will not pass on, and a
//! request framed twice (`Transfer-Encoding` and `Content-Length`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use api_support::probe::*;
use api_support::temp::TempDir;

/// Sends `request` (one or more requests, pipelined) and reads until the host closes the
/// connection. The last request should say `Connection: close`.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request).expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status of each response on the connection, in order.
fn statuses(answer: &str) -> Vec<u16> {
    answer
        .match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| answer.get(at + 9..at + 12)?.parse().ok())
        .collect()
}

const THEN_HELLO: &[u8] = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

#[test]
fn a_header_value_that_is_not_utf8_is_spins_empty_500_before_the_component_runs() {
    let state = TempDir::new("non-utf8-header");
    let host = start_probe(&state);
    for header in [
        &b"Idempotency-Key: caf\xe9"[..],
        b"Bookmark: \xff\xfe",
        b"X-Any: ok\xc3",
    ] {
        let request = [
            b"GET /anything HTTP/1.1\r\nHost: x\r\n",
            header,
            b"\r\n\r\n",
            THEN_HELLO,
        ]
        .concat();
        let answer = exchange(host.addr(), &request);
        // A 500 with no body, and the connection stays open for the next request.
        assert_eq!(statuses(&answer), [500, 200], "{answer}");
        let (head, rest) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-length: 0"), "{head}");
        assert!(!head.contains("content-type"), "{head}");
        assert!(rest.starts_with("HTTP/1.1 200"), "{rest}");
        assert!(rest.contains("\r\nhello\r\n"), "{rest}");
    }
    // Only routed requests are refused: Spin answers its 404 and its health check first.
    for (path, status) in [
        ("/.well-known/spin/health", 200),
        ("/.well-known/spin/other", 404),
    ] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nBookmark: ");
        let request = [request.as_bytes(), b"\xe9\r\nConnection: close\r\n\r\n"].concat();
        assert_eq!(
            statuses(&exchange(host.addr(), &request)),
            [status],
            "{path}"
        );
    }
    // Valid UTF-8 beyond ASCII reaches the component.
    let request = [
        &b"GET /anything HTTP/1.1\r\nHost: x\r\nIdempotency-Key: caf\xc3\xa9\r\n"[..],
        b"Connection: close\r\n\r\n",
    ]
    .concat();
    let answer = exchange(host.addr(), &request);
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.contains("caf\u{e9}"), "{answer}");
}

#[test]
fn a_host_header_spin_cannot_read_closes_the_connection_unanswered() {
    let state = TempDir::new("bad-host");
    let host = start_probe(&state);
    for request in [
        &b"GET /hello HTTP/1.1\r\nHost: caf\xe9\r\n\r\n"[..],
        b"GET /hello HTTP/1.1\r\nHost: a b\r\n\r\n",
        b"GET /hello HTTP/1.1\r\n\r\n",
        b"GET http://a/hello HTTP/1.1\r\nHost: b\r\n\r\n",
    ] {
        let answer = exchange(host.addr(), &[request, THEN_HELLO].concat());
        assert_eq!(answer, "", "{}", String::from_utf8_lossy(request));
    }
    // The URI's authority stands in for a missing Host header.
    let answer = exchange(
        host.addr(),
        b"GET http://a/hello HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(statuses(&answer), [200], "{answer}");
    // `Connection` is the server's alone: the component does not see it.
    let answer = exchange(
        host.addr(),
        b"GET /anything HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(!answer.contains("\"connection\""), "{answer}");
}

/// Spin 4.1 differs here (host/README.md): its hyper keeps the connection and serves the
/// request after the chunked body.
#[test]
fn a_request_with_both_transfer_encoding_and_content_length_closes_the_connection() {
    let state = TempDir::new("te-cl");
    let host = start_probe(&state);
    let smuggled = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let chunked_body = [&b"0\r\n\r\n"[..], smuggled].concat();
    let head = "POST /anything HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n";
    // The body is read as chunked (RFC 9112 §6.3), the answer is the component's, and then
    // the connection is closed (§6.1): the request after the chunked body is never served.
    let request = format!("{head}Content-Length: {}\r\n\r\n", chunked_body.len());
    let answer = exchange(host.addr(), &[request.as_bytes(), &chunked_body].concat());
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.contains("\"POST\""), "{answer}");
    assert!(!answer.contains("content-length\":"), "{answer}");
    assert!(!answer.contains("hello"), "{answer}");
    // With Transfer-Encoding alone, the next request on the connection is served.
    let answer = exchange(
        host.addr(),
        &[format!("{head}\r\n").as_bytes(), &chunked_body].concat(),
    );
    assert_eq!(statuses(&answer), [200, 200], "{answer}");
    assert!(answer.contains("\r\nhello\r\n"), "{answer}");
}
