//! What an operator sees (docs/operations.md, "Watching it"): the host exports traces,
//! metrics and logs as `spin up` does, to a real OTLP receiver that decodes them with the
//! official protobuf definitions; a write forwarded from a site to its home is one trace; the
//! app writes one record per request; and no secret is in any byte exported.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use api_support::app::{AUDIT_KEY, OPERATOR_TOKEN};
use api_support::otlp::{Protocol, Received, Receiver, SentLog, SentSpan};
use api_support::scenario::ReservationSpec;
use api_support::stores::Sites;
use api_support::temp::TempDir;
use api_support::{Client, HostProcess};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::{Value, json};

const NODE: &str = "node-watched";
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const RELEASE_ROUTE: &str = "/v1/nodes/:nodeId/reservations/:id/release";

/// A `spin-host` process exporting to `receiver` as `service`, on `runtime_config`.
fn exporting_host(
    dir: &Path,
    service: &str,
    receiver: &Receiver,
    runtime_config: Option<&Path>,
    env: &[(&str, &str)],
) -> HostProcess {
    let state = dir.join(service);
    std::fs::create_dir_all(&state).expect("state dir");
    let log = std::fs::File::create(dir.join(format!("{service}.log"))).expect("host log");
    let mut args: Vec<&OsStr> = Vec::new();
    if let Some(config) = runtime_config {
        args.extend([OsStr::new("--runtime-config-file"), config.as_os_str()]);
    }
    let endpoint = receiver.endpoint();
    let mut all = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", service),
        // Sent soon after they happen, so the test waits little.
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_BLRP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ];
    all.extend_from_slice(env);
    HostProcess::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_spin-host")),
        &state,
        log,
        &args,
        &all,
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn only<'a>(spans: &'a [SentSpan], what: &str, test: impl Fn(&SentSpan) -> bool) -> &'a SentSpan {
    let found: Vec<&SentSpan> = spans.iter().filter(|s| test(s)).collect();
    assert_eq!(found.len(), 1, "exactly one {what}: {found:#?}");
    found[0]
}

fn children(spans: &[SentSpan], parent: &SentSpan) -> Vec<SentSpan> {
    spans
        .iter()
        .filter(|s| s.span.parent_span_id == parent.span.span_id)
        .cloned()
        .collect()
}

/// The request records a service's component wrote, parsed.
fn request_records(logs: &[SentLog], service: &str, component: &str) -> Vec<(Value, SentLog)> {
    logs.iter()
        .filter(|log| log.service == service)
        .filter(|log| log.attribute("component_id").as_deref() == Some(component))
        .filter_map(|log| {
            let body: Value = serde_json::from_str(log.body()?.trim()).ok()?;
            (body["event"] == "request").then(|| (body, log.clone()))
        })
        .collect()
}

#[test]
fn a_release_at_a_site_is_one_trace_with_the_home_its_metrics_and_its_log_records_and_no_secret() {
    let dir = TempDir::new("telemetry");
    let receiver = Receiver::start(Protocol::HttpProtobuf);
    let sites = Sites::start_in_cells(dir.path(), 1, Duration::ZERO, 1);
    let home = exporting_host(
        dir.path(),
        "home",
        &receiver,
        Some(sites.primary_config()),
        &[],
    );
    api_support::clock::until("health at home", Duration::from_secs(60), || {
        api_support::http::get(&format!("{}/v1/healthz", home.base)).status == 200
    });
    let site = exporting_host(
        dir.path(),
        "site",
        &receiver,
        Some(sites.site_config(1)),
        &[("SPIN_VARIABLE_HOME_URL", home.base.as_str())],
    );

    // The market, made at home.
    let operator = Client::new(&home.base, Some(OPERATOR_TOKEN.to_owned()));
    for org in ["owner", "research"] {
        operator
            .post("/v1/orgs", &json!({ "id": org, "name": org }))
            .expect_status(201);
    }
    let key = operator
        .post(
            "/v1/orgs/owner/keys",
            &json!({ "name": "owner key", "role": "capacity-manager" }),
        )
        .expect_status(201)
        .json();
    let owner_token = key["token"].as_str().expect("token").to_owned();
    let key_secret = owner_token.rsplit('.').next().expect("secret").to_owned();
    operator
        .put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": "owner", "unitIds": ["gpu-0", "gpu-1"] }),
        )
        .expect_status(201);
    let (_, reservation) = ReservationSpec::on(NODE, &["gpu-0", "gpu-1"])
        .audience(&["research"])
        .make_with(&operator);
    let reservation = reservation["id"].as_str().expect("id").to_owned();

    // The release, at the site, in the client's trace.
    let owner = Client::new(&site.base, Some(owner_token.clone())).with_header(
        "traceparent",
        &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
    );
    let released = owner.post(
        &format!("/v1/nodes/{NODE}/reservations/{reservation}/release"),
        &json!({ "unitIds": ["gpu-0"] }),
    );
    let released = released.expect_status(200);
    let bookmark = released.header("bookmark").expect("a bookmark").to_owned();

    let in_trace = |received: &Received| -> Vec<SentSpan> {
        received
            .spans()
            .into_iter()
            .filter(|s| hex(&s.span.trace_id) == CLIENT_TRACE)
            .collect()
    };
    let spans = receiver.wait_for("the release's spans at the site and at home", |received| {
        let spans = in_trace(received);
        let served = |service: &str| {
            spans.iter().any(|s| {
                s.service == service
                    && s.span.kind == SpanKind::Server as i32
                    && s.span.name == format!("POST {RELEASE_ROUTE}")
            })
        };
        let statements_at_home = spans
            .iter()
            .any(|s| s.service == "home" && s.span.name == "spin_sqlite.execute");
        (served("site") && served("home") && statements_at_home).then_some(spans)
    });

    // The site's server span continues the client's trace ...
    let site_server = only(&spans, "server span at the site", |s| {
        s.service == "site" && s.span.kind == SpanKind::Server as i32
    });
    assert_eq!(hex(&site_server.span.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        site_server.attribute("http.route").as_deref(),
        Some(RELEASE_ROUTE)
    );
    assert_eq!(
        site_server.attribute("http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        site_server
            .attribute("http.response.status_code")
            .as_deref(),
        Some("200")
    );
    // ... runs the component, which sends the write home ...
    let site_runs = children(&spans, site_server);
    let site_run = only(&site_runs, "component run at the site", |s| {
        s.span.name == "execute_wasm_component release"
    });
    let site_calls = children(&spans, site_run);
    let site_send = only(&site_calls, "send home", |s| {
        s.span.kind == SpanKind::Client as i32 && s.span.name == "POST"
    });
    assert_eq!(
        site_send.attribute("url.full"),
        Some(format!(
            "{}/v1/nodes/{NODE}/reservations/{reservation}/release",
            home.base
        ))
    );
    assert_eq!(
        site_send.attribute("http.response.status_code").as_deref(),
        Some("200")
    );
    // The site only reads (and asks once, with a statement on a table that does not exist,
    // whether its database is a replica: docs/design.md, "Reads at a site").
    let site_statements: Vec<String> = site_calls
        .iter()
        .filter(|s| s.span.name == "spin_sqlite.execute")
        .filter_map(|s| s.attribute("query"))
        .collect();
    assert!(
        site_statements
            .iter()
            .all(|q| q.starts_with("SELECT") || q.contains("site_probe_no_such_table")),
        "the site writes nothing itself: {site_statements:#?}"
    );
    // ... and the home's server span is the send's child, in the same trace.
    let home_server = only(&spans, "server span at home", |s| {
        s.service == "home" && s.span.kind == SpanKind::Server as i32
    });
    assert_eq!(home_server.span.parent_span_id, site_send.span.span_id);
    assert_eq!(
        home_server
            .attribute("http.response.status_code")
            .as_deref(),
        Some("200")
    );
    let home_runs = children(&spans, home_server);
    let home_run = only(&home_runs, "component run at home", |s| {
        s.span.name == "execute_wasm_component release"
    });
    assert!(
        home_run.span.events.iter().any(|event| {
            event.attributes.iter().any(|kv| {
                kv.key == "app_log"
                    && kv
                        .value
                        .as_ref()
                        .is_some_and(|v| format!("{v:?}").contains("request"))
            })
        }),
        "the component's output is an event of its run, as Spin makes it"
    );
    let home_calls = children(&spans, home_run);
    let statements: Vec<&SentSpan> = home_calls
        .iter()
        .filter(|s| s.span.name == "spin_sqlite.execute")
        .collect();
    assert!(
        !statements.is_empty(),
        "the home's statements are its run's children"
    );
    for statement in &statements {
        assert_eq!(statement.span.kind, SpanKind::Client as i32);
        assert_eq!(
            statement.attribute("db.system.name").as_deref(),
            Some("sqlite")
        );
        assert!(
            statement.attribute("query").is_some_and(|q| !q.is_empty()),
            "its SQL"
        );
        let keys: Vec<&str> = statement
            .span
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert!(
            keys.iter().all(|k| !k.contains("param")),
            "a statement's span carries its SQL, never its parameters: {keys:?}"
        );
    }
    assert!(
        statements
            .iter()
            .any(|s| s.attribute("query").is_some_and(|q| q.contains("INSERT"))),
        "the write's statements run at home"
    );
    for name in ["spin_sqlite.open", "spin_variables.get"] {
        assert!(
            home_calls.iter().any(|s| s.span.name == name),
            "a {name} span at home"
        );
    }
    assert!(
        home_calls
            .iter()
            .any(|s| s.span.name.starts_with("wasi_key_value.")),
        "the key-value store's calls at home"
    );

    // Metrics from both processes, by Spin's names.
    let wanted = [
        "spin.request_count",
        "spin.component_cpu_time",
        "spin.component_memory_used",
        "outbound_connection_permits_acquired",
    ];
    let exported_metrics =
        receiver.wait_for("Spin's metrics from the site and the home", |received| {
            let names = received.metric_names();
            ["site", "home"]
                .iter()
                .all(|service| {
                    names.get(*service).is_some_and(|have| {
                        wanted.iter().all(|name| have.iter().any(|h| h == name))
                    })
                })
                .then(|| names.into_values().flatten().collect::<Vec<String>>())
        });

    // One record per request, at both ends, in the trace.
    let (site_record, home_record) = receiver.wait_for("the release's records", |received| {
        let logs = received.logs();
        let of = |service| {
            request_records(&logs, service, "release")
                .into_iter()
                .find(|(record, _)| record["method"] == "POST")
        };
        Some((of("site")?, of("home")?))
    });
    let (site_record, site_log) = site_record;
    let (home_record, home_log) = home_record;
    assert_eq!(hex(&site_log.record.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&home_log.record.trace_id), CLIENT_TRACE);
    assert_eq!(site_record["route"], RELEASE_ROUTE);
    assert_eq!(site_record["status"], 200);
    assert_eq!(site_record["forwarded"], "to-home");
    assert_eq!(site_record["bookmark"], bookmark.as_str());
    assert_eq!(home_record["route"], RELEASE_ROUTE);
    assert_eq!(home_record["status"], 200);
    assert_eq!(home_record["forwarded"], "from-site");
    assert_eq!(home_record["org"], "owner");
    assert_eq!(home_record["cell"], "default");
    assert_eq!(home_record["code"], Value::Null);
    assert!(home_record["statements"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(home_record["write_attempts"], 1);
    assert!(home_record["bookmark"].is_string());
    assert_eq!(
        home_record["request_id"], site_record["request_id"],
        "the home answers under the request id the site gave it"
    );
    for field in ["copy_wait_ms", "share_wait_ms", "duration_ms"] {
        assert!(
            site_record[field].is_number() && home_record[field].is_number(),
            "{field}"
        );
    }

    the_dashboard_reads_only_what_was_exported(&home_record, &exported_metrics);

    // A refusal names its problem.
    let stranger = Client::new(&site.base, Some("gpr.nokey.nosecret".to_owned()));
    stranger
        .post(
            &format!("/v1/nodes/{NODE}/reservations/{reservation}/release"),
            &json!({ "unitIds": ["gpu-1"] }),
        )
        .expect_status(401);
    // A refusal names its problem where it was decided: at home, which the site forwarded
    // the write to (the token is of the right form; only the home knows it is no key's).
    receiver.wait_for("the refusal's records", |received| {
        let logs = received.logs();
        let refusal = |service| {
            request_records(&logs, service, "release")
                .into_iter()
                .map(|(record, _)| record)
                .find(|record| record["status"] == 401)
        };
        let (at_site, at_home) = (refusal("site")?, refusal("home")?);
        assert_eq!(at_site["forwarded"], "to-home");
        assert_eq!(at_home["code"], "unauthorized", "{at_home}");
        assert_eq!(at_home["org"], Value::Null);
        Some(())
    });

    // No secret in any byte received.
    let everything = receiver.read(|received| received.bytes.clone());
    assert!(everything.len() > 1000, "the receiver was sent the exports");
    for (what, secret) in [
        ("the owner's bearer token", owner_token.as_str()),
        ("the key's secret", key_secret.as_str()),
        ("the operator token", OPERATOR_TOKEN),
        ("the audit key", AUDIT_KEY),
    ] {
        assert!(
            !everything
                .windows(secret.len())
                .any(|w| w == secret.as_bytes()),
            "{what} was exported"
        );
    }
}

#[test]
fn grpc_is_taken_as_spin_takes_it() {
    let dir = TempDir::new("telemetry-grpc");
    let receiver = Receiver::start(Protocol::Grpc);
    let host = exporting_host(
        dir.path(),
        "grpc",
        &receiver,
        None,
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
    );
    api_support::http::get(&format!("{}/v1/healthz", host.base)).expect_status(200);
    receiver.wait_for("the health check's server span over gRPC", |received| {
        received
            .spans()
            .into_iter()
            .find(|s| s.span.name == "GET /v1/healthz" && s.service == "grpc")
    });
}

#[test]
fn with_no_collector_to_reach_requests_are_served_and_the_record_is_still_written() {
    let dir = TempDir::new("telemetry-unreachable");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let log = std::fs::File::create(dir.path().join("host.log")).expect("host log");
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let endpoint = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let host = HostProcess::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_spin-host")),
        &state,
        log,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    for _ in 0..20 {
        api_support::http::get(&format!("{}/v1/healthz", host.base)).expect_status(200);
    }
    let operator = Client::new(&host.base, Some(OPERATOR_TOKEN.to_owned()));
    operator
        .post("/v1/orgs", &json!({ "id": "acme", "name": "Acme" }))
        .expect_status(201);
    let written = std::fs::read_to_string(state.join("logs/identity_stdout.txt")).expect("log");
    let record: Value = written
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|record| record["event"] == "request" && record["method"] == "POST")
        .expect("the org's creation logged");
    assert_eq!(record["route"], "/v1/orgs");
    assert_eq!(record["status"], 201);
    assert_eq!(record["operator"], true);
    assert!(!written.contains(OPERATOR_TOKEN), "no token in the log");
}

#[test]
fn request_log_none_writes_no_record() {
    let dir = TempDir::new("telemetry-quiet");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let log = std::fs::File::create(dir.path().join("host.log")).expect("host log");
    let host = HostProcess::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_spin-host")),
        &state,
        log,
        &[],
        &[("SPIN_VARIABLE_REQUEST_LOG", "none")],
    );
    let operator = Client::new(&host.base, Some(OPERATOR_TOKEN.to_owned()));
    operator
        .post("/v1/orgs", &json!({ "id": "acme", "name": "Acme" }))
        .expect_status(201);
    operator.get("/v1/orgs/nobody").expect_status(404);
    let written =
        std::fs::read_to_string(state.join("logs/identity_stdout.txt")).unwrap_or_default();
    assert!(!written.contains("\"event\":\"request\""), "{written}");
}

/// Every query of `deploy/grafana/reservations.json` reads a metric the host exported (named
/// as a collector's Prometheus exporter names it: dots as underscores, `_total` after a
/// counter, `_bucket` after a histogram) or a field of the app's request record.
fn the_dashboard_reads_only_what_was_exported(record: &Value, metrics: &[String]) {
    let path = api_support::workspace().join("deploy/grafana/reservations.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("JSON");
    let fields: Vec<&str> = record
        .as_object()
        .expect("a record is an object")
        .keys()
        .map(String::as_str)
        .collect();
    let prometheus_names: Vec<String> = metrics
        .iter()
        .flat_map(|name| {
            let name = name.replace('.', "_");
            [format!("{name}_total"), format!("{name}_bucket")]
        })
        .collect();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("an expression");
            queries += 1;
            match target["datasource"]["type"].as_str() {
                Some("prometheus") => {
                    let metric = expr
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .find(|word| word.starts_with("spin_") || word.starts_with("outbound_"))
                        .expect("a metric");
                    assert!(
                        prometheus_names.iter().any(|name| name == metric),
                        "panel {}: {metric} is not exported ({prometheus_names:?})",
                        panel["title"]
                    );
                }
                Some("loki") => {
                    let (_, pipeline) = expr.split_once("| json").expect("records parsed as JSON");
                    let words = pipeline
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .filter(|word| word.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
                    for word in words {
                        let logql = [
                            "by",
                            "unwrap",
                            "request",
                            "auto",
                            "rate_interval",
                            "interval",
                            "service_name",
                            "count_over_time",
                            "avg_over_time",
                            "quantile_over_time",
                            "sum",
                            "home",
                            "to",
                        ];
                        assert!(
                            logql.contains(&word) || fields.contains(&word),
                            "panel {}: `{word}` is neither LogQL nor a field of the record {fields:?}",
                            panel["title"]
                        );
                    }
                }
                other => panic!("panel {}: an unknown data source {other:?}", panel["title"]),
            }
        }
    }
    assert!(queries >= 10, "the dashboard has its panels");
}
