//! A receiver of OpenTelemetry exports, as a collector is one: OTLP over HTTP/protobuf
//! (`POST /v1/traces`, `/v1/metrics`, `/v1/logs`) or over gRPC, each message decoded with the
//! official protobuf definitions (`opentelemetry-proto`, generated from the OpenTelemetry
//! project's `.proto` files). It keeps every message, and every byte it received, to be
//! searched.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// What the receiver has been sent.
#[derive(Default)]
pub struct Received {
    pub traces: Vec<ExportTraceServiceRequest>,
    pub metrics: Vec<ExportMetricsServiceRequest>,
    pub logs: Vec<ExportLogsServiceRequest>,
    /// Every message's bytes, as they arrived.
    pub bytes: Vec<u8>,
}

/// A span, with the `service.name` of the process that sent it.
#[derive(Clone, Debug)]
pub struct SentSpan {
    pub service: String,
    pub span: Span,
}

impl SentSpan {
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

/// A log record, with the `service.name` of the process that sent it.
#[derive(Clone, Debug)]
pub struct SentLog {
    pub service: String,
    pub record: LogRecord,
}

impl SentLog {
    pub fn body(&self) -> Option<String> {
        self.record.body.as_ref().and_then(text)
    }

    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.record.attributes, key)
    }
}

fn text(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(text)
}

fn service(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    resource
        .and_then(|r| attribute(&r.attributes, "service.name"))
        .unwrap_or_default()
}

impl Received {
    pub fn spans(&self) -> Vec<SentSpan> {
        self.traces
            .iter()
            .flat_map(|request| &request.resource_spans)
            .flat_map(|resource| {
                let service = service(resource.resource.as_ref());
                resource
                    .scope_spans
                    .iter()
                    .flat_map(|scope| &scope.spans)
                    .map(move |span| SentSpan {
                        service: service.clone(),
                        span: span.clone(),
                    })
            })
            .collect()
    }

    pub fn logs(&self) -> Vec<SentLog> {
        self.logs
            .iter()
            .flat_map(|request| &request.resource_logs)
            .flat_map(|resource| {
                let service = service(resource.resource.as_ref());
                resource
                    .scope_logs
                    .iter()
                    .flat_map(|scope| &scope.log_records)
                    .map(move |record| SentLog {
                        service: service.clone(),
                        record: record.clone(),
                    })
            })
            .collect()
    }

    /// The names of the metrics received, by the `service.name` that sent them.
    pub fn metric_names(&self) -> HashMap<String, Vec<String>> {
        let mut names: HashMap<String, Vec<String>> = HashMap::new();
        for resource in self.metrics.iter().flat_map(|r| &r.resource_metrics) {
            let service = service(resource.resource.as_ref());
            for metric in resource.scope_metrics.iter().flat_map(|s| &s.metrics) {
                let list = names.entry(service.clone()).or_default();
                if !list.contains(&metric.name) {
                    list.push(metric.name.clone());
                }
            }
        }
        names
    }
}

/// How a receiver takes exports.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    HttpProtobuf,
    Grpc,
}

/// A receiver listening on loopback until dropped.
pub struct Receiver {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    pub fn start(protocol: Protocol) -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the receiver");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a port for the receiver");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::new(Mutex::new(Received::default()));
        let collected = Collected(received.clone());
        match protocol {
            Protocol::HttpProtobuf => {
                runtime.spawn(serve_http(listener, collected));
            }
            Protocol::Grpc => {
                let incoming = tokio_stream_of(listener);
                runtime.spawn(
                    tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(collected.clone()))
                        .add_service(MetricsServiceServer::new(collected.clone()))
                        .add_service(LogsServiceServer::new(collected))
                        .serve_with_incoming(incoming),
                );
            }
        }
        Receiver {
            addr,
            received,
            _runtime: runtime,
        }
    }

    /// What `OTEL_EXPORTER_OTLP_ENDPOINT` is set to for this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits (up to 30 s) until what was received satisfies `done`, then reads it.
    pub fn wait_for<T>(&self, what: &str, mut done: impl FnMut(&Received) -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(found) = done(&self.received.lock().unwrap()) {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the receiver was never sent {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn read<T>(&self, read: impl FnOnce(&Received) -> T) -> T {
        read(&self.received.lock().unwrap())
    }
}

#[derive(Clone)]
struct Collected(Arc<Mutex<Received>>);

impl Collected {
    fn keep(&self, bytes: &[u8], keep: impl FnOnce(&mut Received)) {
        let mut received = self.0.lock().unwrap();
        received.bytes.extend_from_slice(bytes);
        keep(&mut received);
    }
}

async fn serve_http(listener: tokio::net::TcpListener, collected: Collected) {
    use http_body_util::{BodyExt, Full};
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let collected = collected.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let collected = collected.clone();
                    async move {
                        let path = request.uri().path().to_owned();
                        let bytes = request.into_body().collect().await?.to_bytes();
                        let answer = match path.as_str() {
                            "/v1/traces" => ExportTraceServiceRequest::decode(bytes.as_ref())
                                .map(|m| collected.keep(&bytes, |r| r.traces.push(m)))
                                .map(|()| ExportTraceServiceResponse::default().encode_to_vec()),
                            "/v1/metrics" => ExportMetricsServiceRequest::decode(bytes.as_ref())
                                .map(|m| collected.keep(&bytes, |r| r.metrics.push(m)))
                                .map(|()| ExportMetricsServiceResponse::default().encode_to_vec()),
                            "/v1/logs" => ExportLogsServiceRequest::decode(bytes.as_ref())
                                .map(|m| collected.keep(&bytes, |r| r.logs.push(m)))
                                .map(|()| ExportLogsServiceResponse::default().encode_to_vec()),
                            _ => Ok(Vec::new()),
                        };
                        let (status, body) = match answer {
                            Ok(body) => (200, body),
                            Err(e) => (400, e.to_string().into_bytes()),
                        };
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(bytes::Bytes::from(body)))
                                .expect("a response"),
                        )
                    }
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

#[tonic::async_trait]
impl TraceService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let message = request.into_inner();
        self.keep(&message.encode_to_vec(), |r| r.traces.push(message.clone()));
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let message = request.into_inner();
        self.keep(&message.encode_to_vec(), |r| {
            r.metrics.push(message.clone())
        });
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let message = request.into_inner();
        self.keep(&message.encode_to_vec(), |r| r.logs.push(message.clone()));
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}
