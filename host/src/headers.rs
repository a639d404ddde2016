//! The `spin-*` request headers a component sees, as `spin up` sets them.
//!
//! For route `/v1/nodes/:nodeId/reservations/:id/release` and
//! `POST /v1/nodes/n1/reservations/r1/release?x=1`:
//!
//! | header                      | value                                                      |
//! |-----------------------------|------------------------------------------------------------|
//! | `spin-full-url`             | `http://127.0.0.1:3000/v1/nodes/n1/reservations/r1/release?x=1` |
//! | `spin-path-info`            | `` (the part matched by a trailing `/...`)                 |
//! | `spin-matched-route`        | the route, normalised (absolute, one trailing `/` removed) |
//! | `spin-component-route`      | the route as written, without a trailing `/...`            |
//! | `spin-raw-component-route`  | the route as written                                       |
//! | `spin-base-path`            | `/`                                                        |
//! | `spin-client-addr`          | `127.0.0.1:<port>` of the client                           |
//! | `spin-path-match-nodeid`    | `n1` (one per `:name`, lower-cased, `_` as `-`)            |
//! | `spin-path-match-id`        | `r1`                                                       |
//!
//! The client's `Host` header is removed (wasi:http forbids it); its value
//! only goes into `spin-full-url` (`localhost` if absent). Headers the client
//! sent under these names are replaced, so a client cannot forge them.

use std::net::SocketAddr;

use http::header::{HOST, HeaderMap, HeaderName, HeaderValue};
use http::uri::Uri;

use crate::routes::RouteMatch;

pub const FULL_URL: &str = "spin-full-url";
pub const PATH_INFO: &str = "spin-path-info";
pub const MATCHED_ROUTE: &str = "spin-matched-route";
pub const COMPONENT_ROUTE: &str = "spin-component-route";
pub const RAW_COMPONENT_ROUTE: &str = "spin-raw-component-route";
pub const BASE_PATH: &str = "spin-base-path";
pub const CLIENT_ADDR: &str = "spin-client-addr";
pub const PATH_MATCH_PREFIX: &str = "spin-path-match-";

/// The `spin-*` headers for a routed request, in the order Spin adds them.
pub fn spin_headers(
    uri: &Uri,
    host: Option<&str>,
    route: &RouteMatch,
    client: SocketAddr,
) -> Vec<(String, String)> {
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = host
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or("localhost");
    let mut headers = vec![
        (PATH_INFO.to_string(), route.path_info.clone()),
        (
            FULL_URL.to_string(),
            format!("{scheme}://{host}{path_and_query}"),
        ),
        (MATCHED_ROUTE.to_string(), route.based_route.clone()),
        (BASE_PATH.to_string(), "/".to_string()),
        (RAW_COMPONENT_ROUTE.to_string(), route.raw_route.clone()),
        (COMPONENT_ROUTE.to_string(), route.component_route.clone()),
        (CLIENT_ADDR.to_string(), client.to_string()),
    ];
    for (name, value) in &route.params {
        headers.push((path_match_header(name), value.clone()));
    }
    headers
}

/// `spin-path-match-<name>`: Spin upper-cases the capture name into an
/// environment-style key and then turns it into a header name, so the name
/// ends up lower-cased with `_` as `-`.
pub fn path_match_header(param: &str) -> String {
    format!(
        "{PATH_MATCH_PREFIX}{}",
        param.to_ascii_lowercase().replace('_', "-")
    )
}

/// Rewrites the request headers the component will see: drops `Host`,
/// drops any client-sent header with a `spin-*` name we set, adds ours.
/// Headers whose name or value is not valid HTTP are skipped, as in Spin.
pub fn prepare(headers: &mut HeaderMap, uri: &Uri, route: &RouteMatch, client: SocketAddr) {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    headers.remove(HOST);
    for (name, value) in spin_headers(uri, host.as_deref(), route, client) {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) else {
            continue;
        };
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::Router;

    fn prepared(route: &str, uri: &str, extra: &[(&str, &str)]) -> HeaderMap {
        let router = Router::build([(route, "c")]).unwrap();
        let uri: Uri = uri.parse().unwrap();
        let m = router.route(uri.path()).expect("route matches");
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:3998"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        for (k, v) in extra {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        prepare(&mut headers, &uri, &m, "127.0.0.1:54321".parse().unwrap());
        headers
    }

    fn get<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
        h.get(name)
            .unwrap_or_else(|| panic!("missing {name}"))
            .to_str()
            .unwrap()
    }

    #[test]
    fn design_example_with_params() {
        let route = "/v1/nodes/:nodeId/reservations/:id/release";
        let h = prepared(route, "/v1/nodes/n1/reservations/r1/release?x=1", &[]);
        assert_eq!(
            get(&h, "spin-full-url"),
            "http://127.0.0.1:3998/v1/nodes/n1/reservations/r1/release?x=1"
        );
        assert_eq!(get(&h, "spin-matched-route"), route);
        assert_eq!(get(&h, "spin-component-route"), route);
        assert_eq!(get(&h, "spin-raw-component-route"), route);
        assert_eq!(get(&h, "spin-path-info"), "");
        assert_eq!(get(&h, "spin-path-match-nodeid"), "n1");
        assert_eq!(get(&h, "spin-path-match-id"), "r1");
        assert_eq!(get(&h, "spin-base-path"), "/");
        assert_eq!(get(&h, "spin-client-addr"), "127.0.0.1:54321");
        assert!(h.get(HOST).is_none());
        assert_eq!(get(&h, "accept"), "*/*");
    }

    #[test]
    fn design_example_with_wildcard() {
        let h = prepared("/...", "/foo/bar?y=2", &[]);
        assert_eq!(get(&h, "spin-matched-route"), "/...");
        assert_eq!(get(&h, "spin-raw-component-route"), "/...");
        assert_eq!(get(&h, "spin-component-route"), "");
        assert_eq!(get(&h, "spin-path-info"), "/foo/bar");
        assert_eq!(
            get(&h, "spin-full-url"),
            "http://127.0.0.1:3998/foo/bar?y=2"
        );
    }

    #[test]
    fn client_cannot_forge_spin_headers() {
        let h = prepared(
            "/...",
            "/x",
            &[
                ("spin-client-addr", "1.2.3.4:5"),
                ("spin-path-info", "/evil"),
            ],
        );
        assert_eq!(get(&h, "spin-client-addr"), "127.0.0.1:54321");
        assert_eq!(get(&h, "spin-path-info"), "/x");
        assert_eq!(h.get_all("spin-client-addr").iter().count(), 1);
    }

    #[test]
    fn path_match_header_names() {
        assert_eq!(path_match_header("nodeId"), "spin-path-match-nodeid");
        assert_eq!(path_match_header("user_id"), "spin-path-match-user-id");
    }

    #[test]
    fn missing_host_means_localhost() {
        let router = Router::build([("/...", "c")]).unwrap();
        let uri: Uri = "/a".parse().unwrap();
        let m = router.route("/a").unwrap();
        let mut headers = HeaderMap::new();
        prepare(&mut headers, &uri, &m, "127.0.0.1:1".parse().unwrap());
        assert_eq!(get(&headers, "spin-full-url"), "http://localhost/a");
    }
}
