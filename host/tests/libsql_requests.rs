//! The libSQL backend against a real sqld, behind a proxy that counts the HTTP requests on
//! their way to it: a guest statement must cost what it costs under Spin, whose client
//! (libsql 0.5) sends each statement as one request. A client that asks the server to
//! describe every statement first doubles the round trips of every transaction, and with
//! them the time the write lock is held, so the count is pinned here.
//!
//! sqld is the suites' own ([`api_support::stores::Sqld`]), from `scripts/stores install`
//! (`target/stores/bin/sqld`, or `SQLD_BIN`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spin_host::sqlite::libsql::LibsqlDatabase;
use spin_host::sqlite::{Connection, Database, Error, QueryResult, Value};

use api_support::TempDir;
use api_support::stores::Sqld;

/// A TCP proxy on loopback in front of `upstream` that reads the HTTP/1.1 requests going
/// through it and records each one's request line, before forwarding it: by the time a
/// response comes back, its request has been counted.
struct CountingProxy {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl CountingProxy {
    fn start(upstream: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(client_reader), Ok(mut server_writer)) =
                    (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let _ = forward_requests(client_reader, &mut server_writer, &seen);
                    let _ = server_writer.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let (mut server, mut client) = (server, client);
                    let _ = std::io::copy(&mut server, &mut client);
                    let _ = client.shutdown(Shutdown::Write);
                });
            }
        });
        CountingProxy { port, requests }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads requests from `client` one at a time (head, then a `content-length` or chunked
/// body), records each, and writes it on to `server`.
fn forward_requests(
    client: TcpStream,
    server: &mut TcpStream,
    seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client);
    loop {
        let mut head = Vec::new();
        let mut request_line = String::new();
        let mut content_length = 0usize;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            head.extend_from_slice(line.as_bytes());
            let trimmed = line.trim_end();
            if request_line.is_empty() {
                request_line = trimmed.to_owned();
                continue;
            }
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.to_ascii_lowercase().contains("chunked");
                }
            }
        }
        seen.lock().unwrap().push(request_line);
        server.write_all(&head)?;
        if chunked {
            loop {
                let mut size_line = String::new();
                reader.read_line(&mut size_line)?;
                server.write_all(size_line.as_bytes())?;
                let size_hex = size_line.trim().split(';').next().unwrap_or("0");
                let size = usize::from_str_radix(size_hex, 16).unwrap_or(0);
                // The chunk and its CRLF; after the last (empty) chunk, the final CRLF.
                copy_exact(&mut reader, server, size + 2)?;
                if size == 0 {
                    break;
                }
            }
        } else {
            copy_exact(&mut reader, server, content_length)?;
        }
        server.flush()?;
    }
}

fn copy_exact(from: &mut impl Read, to: &mut impl Write, n: usize) -> std::io::Result<()> {
    let copied = std::io::copy(&mut from.take(n as u64), to)?;
    if copied as usize == n {
        Ok(())
    } else {
        Err(std::io::ErrorKind::UnexpectedEof.into())
    }
}

/// One statement through the backend, as the `sqlite` binding runs a guest's `execute`, and
/// how many HTTP requests it cost.
async fn run(
    proxy: &CountingProxy,
    connection: &mut Box<dyn Connection>,
    statement: &str,
    parameters: Vec<Value>,
) -> (Result<QueryResult, Error>, usize) {
    let before = proxy.count();
    let result = connection.execute(statement.to_owned(), parameters).await;
    (result, proxy.count() - before)
}

#[test]
fn every_libsql_statement_is_one_http_request_to_sqld() {
    let dir = TempDir::new("libsql-requests");
    let sqld = Sqld::start(dir.path());
    let proxy = CountingProxy::start(sqld.port());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");

    runtime.block_on(async {
        let database = LibsqlDatabase::new(&proxy.url(), "");
        let mut statements = 0;

        // Opening sends nothing: the connection reaches the server on its first statement.
        let mut setup = database.open().await.expect("open");
        assert_eq!(proxy.count(), 0, "open sent {:?}", proxy.requests());
        let (result, requests) = run(
            &proxy,
            &mut setup,
            "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)",
            Vec::new(),
        )
        .await;
        result.expect("create table");
        assert_eq!(requests, 1, "CREATE TABLE");
        statements += 1;

        // Writes outside a transaction, each its own commit.
        for i in 0..10 {
            let (result, requests) = run(
                &proxy,
                &mut setup,
                "INSERT INTO t (id, name) VALUES (?, ?)",
                vec![Value::Integer(i), Value::Text(format!("row {i}"))],
            )
            .await;
            result.expect("insert");
            assert_eq!(requests, 1, "INSERT {i}");
            statements += 1;
        }

        // A transaction on a second connection: BEGIN, its writes and COMMIT, one each.
        let mut writer = database.open().await.expect("open");
        for (i, statement) in ["BEGIN IMMEDIATE", "INSERT INTO t (name) VALUES ('in tx')"]
            .into_iter()
            .chain(std::iter::repeat_n(
                "UPDATE t SET name = name || '!' WHERE id < 5",
                3,
            ))
            .chain(["COMMIT"])
            .enumerate()
        {
            let (result, requests) = run(&proxy, &mut writer, statement, Vec::new()).await;
            result.unwrap_or_else(|e| panic!("{statement}: {e:?}"));
            assert_eq!(requests, 1, "statement {i} of the transaction: {statement}");
            statements += 1;
        }

        // A read returns its rows from the same single request.
        let mut reader = database.open().await.expect("open");
        let (result, requests) = run(
            &proxy,
            &mut reader,
            "SELECT count(*), sum(name LIKE '%!') FROM t",
            Vec::new(),
        )
        .await;
        let rows = result.expect("select").rows;
        assert!(
            matches!(
                rows[0].values.as_slice(),
                [Value::Integer(11), Value::Integer(5)]
            ),
            "the rows the writes left: {:?}",
            rows[0].values
        );
        assert_eq!(requests, 1, "SELECT");
        statements += 1;

        // A failing statement is one request too, and reaches the guest as `io`.
        let (result, requests) =
            run(&proxy, &mut reader, "SELECT * FROM missing", Vec::new()).await;
        match result {
            Err(Error::Io(message)) => assert!(message.contains("missing"), "{message}"),
            other => panic!("expected io(..) for a missing table, got {other:?}"),
        }
        assert_eq!(requests, 1, "the failing SELECT");
        statements += 1;

        assert_eq!(
            proxy.count(),
            statements,
            "{statements} statements, requests: {:#?}",
            proxy.requests()
        );

        // Closing a connection that ran statements closes its server-side stream: one more
        // request each, sent in the background (so waited for, not timed).
        drop((setup, writer, reader));
        let deadline = Instant::now() + Duration::from_secs(30);
        while proxy.count() < statements + 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A moment more, so that a request sent after the closes is seen and fails the count.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            proxy.count(),
            statements + 3,
            "{statements} statements and 3 closes, requests: {:#?}",
            proxy.requests()
        );
    });
}
