//! `wasi:http/outgoing-handler` as Spin 4.1 provides it (`factor-outbound-http`,
//! `outbound-networking-config`):
//!
//! - **Allowed hosts.** A component may send only to what its `allowed_outbound_hosts`
//!   names, `<scheme>://<host>[:<port>]` with `*` for any scheme, host or port, `*.domain`
//!   for its subdomains, a port range `a..b`, and a scheme's well-known port when none is
//!   given. An entry may be a template over the application's variables (`"{{ home_url }}"`);
//!   one that renders empty (or to a bare `http://`) is left out, so an optional endpoint
//!   allows nothing while unset; one whose value makes it wrong denies the component every
//!   request (the app still starts, as under Spin, which parses them when a request is sent). Anything else is refused with `HttpRequestDenied`, the error
//!   a Spin component sees.
//! - **One pool per app.** Every instance of every component sends through one hyper
//!   client, so a connection a request opened is kept (idle up to hyper's 90 s) and the next
//!   request to the same origin, from any instance, reuses it. `[outbound_http]
//!   connection_pooling = false` in the runtime config turns that off, as in Spin, whose field
//!   defaults to false when the section is given.
//! - The `Host` header is dropped before sending (Spin's nginx workaround), and a request
//!   waits for its response's head at most the guest's `first-byte-timeout` (600 s unless it
//!   sets one).
//!
//! Plain HTTP only: this host has no TLS client, so an `https` origin is refused with
//! `HttpProtocolError` rather than sent in the clear.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::Instrument as _;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::manifest::template::Template;

/// How long a request waits for the response's head unless the guest says otherwise
/// (Spin's default for each of its timeouts).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The app's outbound HTTP client: one connection pool shared by every instance.
#[derive(Clone)]
pub struct OutboundClient(Client<CountedConnector, WasiBody>);

/// Opens the pool's TCP connections, each counted as Spin counts an outbound connection's
/// permit (`outbound_connection_permits_acquired`, kind `http`).
#[derive(Clone)]
pub struct CountedConnector(HttpConnector);

impl tower_service::Service<http::Uri> for CountedConnector {
    type Response = <HttpConnector as tower_service::Service<http::Uri>>::Response;
    type Error = <HttpConnector as tower_service::Service<http::Uri>>::Error;
    type Future = <HttpConnector as tower_service::Service<http::Uri>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        crate::telemetry::metrics::permit_acquired("http");
        self.0.call(uri)
    }
}

impl OutboundClient {
    pub fn new(pooling: bool) -> OutboundClient {
        let mut builder = Client::builder(TokioExecutor::new());
        if !pooling {
            builder.pool_max_idle_per_host(0);
        }
        OutboundClient(builder.build(CountedConnector(HttpConnector::new())))
    }
}

/// One component's outbound HTTP: its allowed hosts and the app's client.
pub struct Outbound {
    pub(crate) allowed: Arc<AllowedHosts>,
    pub(crate) client: OutboundClient,
}

type SendFuture = Box<
    dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, IoFuture)>> + Send,
>;
type IoFuture = Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>;

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _body_errors: IoFuture,
    ) -> SendFuture {
        use opentelemetry_semantic_conventions::attribute as otel;
        let allowed = self.allowed.allows(request.uri());
        let client = self.client.0.clone();
        let span = tracing::info_span!(
            "spin_outbound_http.send_request",
            "otel.kind" = "client",
            { otel::URL_FULL } = %request.uri(),
            { otel::HTTP_REQUEST_METHOD } = %request.method(),
            "otel.name" = %request.method(),
            { otel::HTTP_RESPONSE_STATUS_CODE } = tracing::field::Empty,
            { otel::SERVER_ADDRESS } = request.uri().host(),
            { otel::SERVER_PORT } = request.uri().port_u16(),
        );
        crate::telemetry::inject_trace_context(&span, request.headers_mut());
        let send = async move {
            match allowed {
                Allowed::Yes => {}
                Allowed::No => return Err(Error::HttpRequestDenied),
                Allowed::NotPlainHttp => return Err(Error::HttpProtocolError),
            }
            request.headers_mut().remove(http::header::HOST);
            let first_byte = options
                .and_then(|o| o.first_byte_timeout)
                .unwrap_or(DEFAULT_TIMEOUT);
            let response = tokio::time::timeout(first_byte, client.request(request))
                .await
                .map_err(|_| Error::ConnectionReadTimeout)?
                .map_err(sending_error)?;
            tracing::Span::current()
                .record(otel::HTTP_RESPONSE_STATUS_CODE, response.status().as_u16());
            let response = response.map(|body| body.map_err(Error::from).boxed_unsync());
            let io: IoFuture = Box::new(async { Ok(()) });
            Ok((response, io))
        };
        Box::new(send.instrument(span))
    }
}

/// What the guest sees of a failed send: the connection refused, or the exchange broken.
fn sending_error(error: hyper_util::client::legacy::Error) -> Error {
    if error.is_connect() {
        return Error::ConnectionRefused;
    }
    match std::error::Error::source(&error).and_then(|e| e.downcast_ref::<hyper::Error>()) {
        Some(e) if e.is_timeout() => Error::ConnectionReadTimeout,
        _ => Error::ConnectionTerminated,
    }
}

enum Allowed {
    Yes,
    No,
    NotPlainHttp,
}

/// A component's `allowed_outbound_hosts`, its templates rendered.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts(Vec<AllowedHost>);

#[derive(Debug, PartialEq, Eq)]
struct AllowedHost {
    scheme: Option<String>,
    host: HostPattern,
    ports: PortPattern,
}

#[derive(Debug, PartialEq, Eq)]
enum HostPattern {
    Any,
    /// `*.example.com`, kept as `.example.com`.
    SubdomainOf(String),
    Exactly(String),
}

#[derive(Debug, PartialEq, Eq)]
enum PortPattern {
    Any,
    Exactly(u16),
    Range(u16, u16),
}

impl AllowedHosts {
    /// Parses `entries`, each rendered by `render` first when it is a template; an entry that
    /// renders empty is left out. An entry Spin would refuse is an error naming it.
    pub fn parse(
        entries: &[String],
        render: impl Fn(&Template) -> Option<String>,
    ) -> anyhow::Result<AllowedHosts> {
        let mut allowed = Vec::new();
        for entry in entries {
            let template = Template::parse(entry).map_err(anyhow::Error::msg)?;
            let is_template = template.references().next().is_some();
            let text = match is_template {
                true => render(&template)
                    .with_context(|| format!("{entry:?} refers to an unknown variable"))?,
                false => entry.clone(),
            };
            if is_template && matches!(text.trim(), "" | "http://" | "https://") {
                continue;
            }
            allowed.push(
                AllowedHost::parse(text.trim())
                    .with_context(|| format!("allowed_outbound_hosts entry {text:?}"))?,
            );
        }
        Ok(AllowedHosts(allowed))
    }

    fn allows(&self, uri: &http::Uri) -> Allowed {
        let scheme = uri.scheme_str().unwrap_or("https");
        let Some(host) = uri.host() else {
            return Allowed::No;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().or_else(|| well_known_port(scheme));
        let allowed = self.0.iter().any(|entry| {
            entry.scheme.as_deref().is_none_or(|s| s == scheme)
                && entry.host.allows(host)
                && port.is_some_and(|port| entry.ports.allows(port))
        });
        match (allowed, scheme) {
            (false, _) => Allowed::No,
            (true, "http") => Allowed::Yes,
            (true, _) => Allowed::NotPlainHttp,
        }
    }
}

impl AllowedHost {
    fn parse(text: &str) -> anyhow::Result<AllowedHost> {
        let Some((scheme, rest)) = text.split_once("://") else {
            bail!("does not contain a scheme (e.g., 'http://' or '*://')");
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            bail!("has a path but is not allowed to");
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(':') => (host, port),
            _ => (rest, ""),
        };
        let scheme = match scheme {
            "*" => None,
            s if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()) => Some(s.to_owned()),
            s => bail!("invalid scheme {s:?}"),
        };
        let host = match host {
            "*" => HostPattern::Any,
            h if h.starts_with("*.") && !h[2..].contains('*') && !h[2..].is_empty() => {
                HostPattern::SubdomainOf(h[1..].to_ascii_lowercase())
            }
            h if h.is_empty() || h.contains('*') => {
                bail!("invalid host {h:?}: wildcards are allowed only as subdomains")
            }
            h => HostPattern::Exactly(
                h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_ascii_lowercase(),
            ),
        };
        let ports = match port {
            "" => match scheme.as_deref().and_then(well_known_port) {
                Some(port) => PortPattern::Exactly(port),
                None => bail!("no port was given and the scheme has no well-known port"),
            },
            "*" => PortPattern::Any,
            p => match p.split_once("..") {
                Some((from, to)) => PortPattern::Range(
                    from.parse().with_context(|| format!("port range {p:?}"))?,
                    to.parse().with_context(|| format!("port range {p:?}"))?,
                ),
                None => PortPattern::Exactly(p.parse().with_context(|| format!("port {p:?}"))?),
            },
        };
        Ok(AllowedHost {
            scheme,
            host,
            ports,
        })
    }
}

impl HostPattern {
    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        match self {
            HostPattern::Any => true,
            HostPattern::SubdomainOf(suffix) => host.ends_with(suffix.as_str()),
            HostPattern::Exactly(exact) => host == *exact,
        }
    }
}

impl PortPattern {
    fn allows(&self, port: u16) -> bool {
        match *self {
            PortPattern::Any => true,
            PortPattern::Exactly(p) => p == port,
            PortPattern::Range(from, to) => (from..to).contains(&port),
        }
    }
}

fn well_known_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        "redis" => Some(6379),
        "mysql" => Some(3306),
        "postgres" => Some(5432),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(entries: &[&str], home_url: &str) -> AllowedHosts {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        let values = [("home_url".to_owned(), home_url.to_owned())].into();
        AllowedHosts::parse(&entries, |t| t.render(&values)).expect("valid entries")
    }

    fn may_send(hosts: &AllowedHosts, url: &str) -> bool {
        matches!(hosts.allows(&url.parse().unwrap()), Allowed::Yes)
    }

    #[test]
    fn a_component_sends_only_where_its_entries_allow() {
        let hosts = allowed(
            &["http://home.internal:3000", "http://*.cells.internal:*"],
            "",
        );
        assert!(may_send(&hosts, "http://home.internal:3000/v1/orgs"));
        assert!(may_send(&hosts, "http://a.cells.internal:9/x"));
        for refused in [
            "http://home.internal:3001/",
            "http://home.internal/",
            "http://cells.internal:9/",
            "http://elsewhere:3000/",
        ] {
            assert!(!may_send(&hosts, refused), "{refused}");
        }
        assert!(!may_send(
            &AllowedHosts::default(),
            "http://home.internal:3000/"
        ));
    }

    #[test]
    fn a_template_renders_from_the_variables_and_an_empty_one_allows_nothing() {
        let home = allowed(&["{{ home_url }}"], "http://127.0.0.1:4100");
        assert!(may_send(&home, "http://127.0.0.1:4100/v1/orgs"));
        assert!(!may_send(&home, "http://127.0.0.1:4101/v1/orgs"));
        assert_eq!(allowed(&["{{ home_url }}"], ""), AllowedHosts::default());
        assert_eq!(
            allowed(&["{{ home_url }}"], "http://"),
            AllowedHosts::default()
        );
    }

    #[test]
    fn entries_spin_refuses_are_refused() {
        for bad in [
            "home.internal",
            "http://a*b.internal",
            "http://h/x",
            "ftp://h",
            "http://h:x",
        ] {
            let entries = vec![bad.to_owned()];
            assert!(AllowedHosts::parse(&entries, |_| None).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_allowed_https_origin_is_refused_rather_than_sent_in_the_clear() {
        let hosts = allowed(&["https://home.internal"], "");
        assert!(matches!(
            hosts.allows(&"https://home.internal/".parse().unwrap()),
            Allowed::NotPlainHttp
        ));
    }
}
