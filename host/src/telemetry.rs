//! OpenTelemetry, exported as `spin up` exports it (Spin's `crates/telemetry`, 4.1).
//!
//! Off unless the environment asks, by the variables Spin reads: `OTEL_EXPORTER_OTLP_ENDPOINT`
//! turns on traces, metrics and logs; `OTEL_EXPORTER_OTLP_{TRACES,METRICS,LOGS}_ENDPOINT` one
//! signal each; `OTEL_SDK_DISABLED` turns all off. The protocol is `http/protobuf` unless
//! `OTEL_EXPORTER_OTLP_PROTOCOL` (or the signal's own `…_PROTOCOL`) says `grpc`. The
//! exporters batch on the runtime and drop what a collector does not take: a request never
//! waits for one.
//!
//! - **Traces**: spans are `tracing` spans, exported through `tracing-opentelemetry` with the
//!   names and attributes Spin gives them: `spin_trigger_http.handle_http_request` (a server
//!   span named `<method> <route>`, its parent taken from the request's W3C `traceparent`),
//!   `spin_trigger_http.execute_wasm` (named `execute_wasm_component <id>`), and one client
//!   span per host call: `spin_sqlite.open`/`.execute` (the statement's SQL, never its
//!   parameters), `wasi_key_value.*`, `spin_variables.get`, `spin_outbound_http.send_request`
//!   (which carries the trace on in `traceparent`). `SPIN_OTEL_TRACING_LEVEL` filters them.
//! - **Metrics**: `spin.request_count`, `spin.component_cpu_time`,
//!   `spin.component_memory_used`, `spin.component_memory_used_on_init`,
//!   `outbound_connection_permits_acquired`.
//! - **Logs**: each write of a component to stdout or stderr is a log record (its body, and
//!   `component_id`), as Spin forwards guest output, carrying the span it was written in; and,
//!   as in Spin, an `app_log` event of that span.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use opentelemetry::logs::{LogRecord as _, Logger as _, LoggerProvider as _};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry::{KeyValue, global};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{
    EnvResourceDetector, ResourceDetector, TelemetryResourceDetector,
};
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{
    EnvFilter, Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _,
};

/// The exporters running in this process, to flush when it stops.
#[derive(Default)]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
    logs: Option<SdkLoggerProvider>,
}

static LOGGER: OnceLock<SdkLogger> = OnceLock::new();
/// Whether metrics are exported: the per-instance measuring is set up only then.
static METRICS: AtomicBool = AtomicBool::new(false);

/// Installs the process's `tracing` subscriber (errors to stderr, filtered by `RUST_LOG`) and
/// whichever exporters the environment turns on. Call once, inside the tokio runtime.
pub fn init(version: &str) -> anyhow::Result<Telemetry> {
    let mut telemetry = Telemetry::default();
    let traces = if enabled(Signal::Traces) {
        let provider = SdkTracerProvider::builder()
            .with_resource(resource(version))
            .with_span_processor(
                opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
                    span_exporter()?,
                    Tokio,
                )
                .build(),
            )
            .build();
        global::set_tracer_provider(provider.clone());
        let filter = EnvFilter::try_from_env("SPIN_OTEL_TRACING_LEVEL")
            .unwrap_or_else(|_| EnvFilter::new("info"));
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("spin"))
            .with_threads(false)
            .with_filter(filter);
        telemetry.traces = Some(provider);
        Some(layer)
    } else {
        None
    };
    let printed = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(
            EnvFilter::from_default_env()
                .add_directive("wasmtime_wasi_http=warn".parse()?)
                // Guest output is in the components' logs already.
                .add_directive("[{app_log}]=off".parse()?)
                .add_directive("[{app_log_non_utf8}]=off".parse()?),
        );
    tracing_subscriber::registry()
        .with(traces)
        .with(printed)
        .try_init()
        .context("a tracing subscriber is installed already")?;
    // The trace context travels in W3C headers whether or not spans are exported.
    global::set_text_map_propagator(TraceContextPropagator::new());

    if enabled(Signal::Metrics) {
        let reader = opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            metric_exporter()?,
            Tokio,
        )
        .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource(version))
            .build();
        global::set_meter_provider(provider.clone());
        METRICS.store(true, Ordering::Relaxed);
        telemetry.metrics = Some(provider);
    }
    if enabled(Signal::Logs) {
        let provider = SdkLoggerProvider::builder()
            .with_resource(resource(version))
            .with_log_processor(
                opentelemetry_sdk::logs::log_processor_with_async_runtime::BatchLogProcessor::builder(
                    log_exporter()?,
                    Tokio,
                )
                .build(),
            )
            .build();
        let _ = LOGGER.set(provider.logger("spin"));
        telemetry.logs = Some(provider);
    }
    Ok(telemetry)
}

impl Telemetry {
    /// Sends what is still batched (each exporter's own timeout bounds the wait).
    pub fn shutdown(self) {
        if let Some(traces) = self.traces {
            let _ = traces.shutdown();
        }
        if let Some(metrics) = self.metrics {
            let _ = metrics.shutdown();
        }
        if let Some(logs) = self.logs {
            let _ = logs.shutdown();
        }
    }
}

/// What one instance used, for Spin's per-instance metrics: the time its guest code ran
/// (between entering and leaving Wasm, host calls excluded) and the memory it grew to.
pub struct InstanceUsage {
    component: Arc<str>,
    guest_time: Duration,
    entered: Option<Instant>,
    memory: usize,
    memory_on_init: usize,
}

impl InstanceUsage {
    pub fn new(component: Arc<str>) -> InstanceUsage {
        InstanceUsage {
            component,
            guest_time: Duration::ZERO,
            entered: None,
            memory: 0,
            memory_on_init: 0,
        }
    }

    /// Whether the store should measure its instance (a call hook costs a little per call).
    pub fn measured() -> bool {
        METRICS.load(Ordering::Relaxed)
    }

    pub fn on_call(&mut self, hook: wasmtime::CallHook) {
        if hook.entering_host() {
            if let Some(entered) = self.entered.take() {
                self.guest_time += entered.elapsed();
            }
        } else {
            self.entered = Some(Instant::now());
        }
    }

    /// The instance is ready: what it holds now is its memory on initialisation.
    pub fn initialised(&mut self) {
        self.memory_on_init = self.memory;
    }

    pub fn report(&self) {
        if Self::measured() {
            metrics::instance_done(
                &self.component,
                self.guest_time.as_secs_f64(),
                self.memory_on_init as u64,
                self.memory as u64,
            );
        }
    }
}

impl wasmtime::ResourceLimiter for InstanceUsage {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.memory += desired.saturating_sub(current);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// A component's write to stdout or stderr: a log record (when logs are exported) and, as
/// Spin does unless `SPIN_DISABLE_LOG_TO_TRACING` is set, an event of the span it was
/// written in.
pub fn app_log(bytes: &[u8], component: &str) {
    static TO_TRACING: OnceLock<bool> = OnceLock::new();
    if *TO_TRACING.get_or_init(|| !set("SPIN_DISABLE_LOG_TO_TRACING")) {
        match std::str::from_utf8(bytes) {
            Ok(text) => tracing::info!(app_log = text),
            Err(_) => tracing::info!(app_log_non_utf8 = escaped(bytes)),
        }
    }
    let Some(logger) = LOGGER.get() else {
        return;
    };
    let mut record = logger.create_log_record();
    match std::str::from_utf8(bytes) {
        Ok(text) => record.set_body(text.to_string().into()),
        Err(_) => {
            record.set_body(escaped(bytes).into());
            record.add_attribute("app_log_non_utf8", true);
        }
    }
    record.add_attribute("component_id", component.to_string());
    let context = tracing::Span::current().context();
    let span = context.span();
    let span = span.span_context();
    if span.is_valid() {
        record.set_trace_context(span.trace_id(), span.span_id(), Some(span.trace_flags()));
    }
    logger.emit(record);
}

/// The first bytes of output that is not UTF-8, escaped.
fn escaped(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(50)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}

/// Makes the current span a child of the trace the request's `traceparent` names.
pub fn extract_trace_context(headers: &http::HeaderMap) {
    let parent = global::get_text_map_propagator(|propagator| {
        propagator.extract(&opentelemetry_http::HeaderExtractor(headers))
    });
    tracing::Span::current().set_parent(parent);
}

/// Writes `span`'s trace context into `headers` (`traceparent`), for the next app to join.
pub fn inject_trace_context(span: &tracing::Span, headers: &mut http::HeaderMap) {
    let context = span.context();
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers))
    });
}

/// Spin's metrics, each recorded in the instrumentation scope of the Spin crate that
/// records it. Instruments bind to the meter provider when first used: a no-op without one.
pub mod metrics {
    use std::sync::LazyLock;

    use opentelemetry::KeyValue;
    use opentelemetry::global;
    use opentelemetry::metrics::{Counter, Histogram};

    static REQUEST_COUNT: LazyLock<Counter<u64>> = LazyLock::new(|| {
        global::meter("spin-trigger-http")
            .u64_counter("spin.request_count")
            .build()
    });
    static CPU_TIME: LazyLock<Histogram<f64>> = LazyLock::new(|| {
        global::meter("spin-factors-executor")
            .f64_histogram("spin.component_cpu_time")
            .build()
    });
    static MEMORY_USED: LazyLock<Histogram<u64>> = LazyLock::new(|| {
        global::meter("spin-factors-executor")
            .u64_histogram("spin.component_memory_used")
            .build()
    });
    static MEMORY_USED_ON_INIT: LazyLock<Histogram<u64>> = LazyLock::new(|| {
        global::meter("spin-factors-executor")
            .u64_histogram("spin.component_memory_used_on_init")
            .build()
    });
    static PERMITS_ACQUIRED: LazyLock<Counter<u64>> = LazyLock::new(|| {
        global::meter("spin-connection-semaphore")
            .u64_counter("outbound_connection_permits_acquired")
            .build()
    });

    /// A request routed to a component (`spin.request_count`).
    pub fn request(app: &str, component: &str) {
        REQUEST_COUNT.add(
            1,
            &[
                KeyValue::new("trigger_type", "http"),
                KeyValue::new("app_id", app.to_string()),
                KeyValue::new("component_id", component.to_string()),
            ],
        );
    }

    /// What an instance used, once it is done: the time its guest code ran, and its memory.
    pub fn instance_done(component: &str, cpu_seconds: f64, memory_on_init: u64, memory: u64) {
        let component = KeyValue::new("component_id", component.to_string());
        CPU_TIME.record(
            cpu_seconds,
            &[component.clone(), KeyValue::new("unit", "s")],
        );
        let bytes = KeyValue::new("unit", "By");
        MEMORY_USED_ON_INIT.record(memory_on_init, &[component.clone(), bytes.clone()]);
        MEMORY_USED.record(memory, &[component, bytes]);
    }

    /// A connection (`http`: a new outbound TCP connection) or store operation (`key-value`)
    /// went ahead: Spin's connection limits are unlimited by default, so none waits.
    pub fn permit_acquired(kind: &'static str) {
        PERMITS_ACQUIRED.add(
            1,
            &[KeyValue::new("kind", kind), KeyValue::new("waited", false)],
        );
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        }
    }
}

fn set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| !value.is_empty())
}

/// A signal is exported once the general endpoint or its own is set, unless the SDK is off.
fn enabled(signal: Signal) -> bool {
    (set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || set(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.name())))
        && !set("OTEL_SDK_DISABLED")
}

enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// The signal's protocol (`…_PROTOCOL`), else the general one, else `http/protobuf`; an
/// unknown value is warned of and taken as `http/protobuf`; `http/json` is refused, as Spin
/// refuses it.
fn protocol(signal: Signal) -> anyhow::Result<Protocol> {
    let name = std::env::var(format!("OTEL_EXPORTER_OTLP_{}_PROTOCOL", signal.name()))
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|_| "http/protobuf".into());
    Ok(match name.as_str() {
        "grpc" => Protocol::Grpc,
        "http/protobuf" => Protocol::HttpProtobuf,
        "http/json" => bail!("http/json OTLP protocol is not supported"),
        other => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "Warning: '{other}' is not a valid OTLP protocol, defaulting to http/protobuf"
                )
            });
            Protocol::HttpProtobuf
        }
    })
}

fn span_exporter() -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    use opentelemetry_otlp::SpanExporter;
    Ok(match protocol(Signal::Traces)? {
        Protocol::Grpc => SpanExporter::builder().with_tonic().build()?,
        Protocol::HttpProtobuf => SpanExporter::builder().with_http().build()?,
    })
}

fn metric_exporter() -> anyhow::Result<opentelemetry_otlp::MetricExporter> {
    use opentelemetry_otlp::MetricExporter;
    Ok(match protocol(Signal::Metrics)? {
        Protocol::Grpc => MetricExporter::builder().with_tonic().build()?,
        Protocol::HttpProtobuf => MetricExporter::builder().with_http().build()?,
    })
}

fn log_exporter() -> anyhow::Result<opentelemetry_otlp::LogExporter> {
    use opentelemetry_otlp::LogExporter;
    Ok(match protocol(Signal::Logs)? {
        Protocol::Grpc => LogExporter::builder().with_tonic().build()?,
        Protocol::HttpProtobuf => LogExporter::builder().with_http().build()?,
    })
}

/// `service.name` from `OTEL_SERVICE_NAME`, else `OTEL_RESOURCE_ATTRIBUTES`, else `spin`;
/// `service.version` the host's; the rest of `OTEL_RESOURCE_ATTRIBUTES`; the SDK's own.
fn resource(version: &str) -> Resource {
    let from_env = EnvResourceDetector::new().detect();
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .map(opentelemetry::Value::from)
        .or_else(|| from_env.get(&opentelemetry::Key::new("service.name")))
        .unwrap_or_else(|| "spin".into());
    Resource::builder()
        .with_attributes([
            KeyValue::new("service.name", service_name),
            KeyValue::new("service.version", version.to_string()),
        ])
        .with_detectors(&[
            Box::new(EnvResourceDetector::new()) as Box<dyn ResourceDetector>,
            Box::new(TelemetryResourceDetector),
        ])
        .build()
}
