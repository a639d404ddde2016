//! Route matching for the HTTP trigger, with Spin's semantics.
//!
//! A route is a `/`-separated pattern of
//! - exact segments (`/v1/nodes`),
//! - named parameters (`/:nodeId`), matching exactly one non-empty segment,
//! - and an optional trailing wildcard (`/...`, or `/*`), matching zero or more
//!   segments.
//!
//! When several routes match a path, Spin picks the most specific one. Routes
//! are compared segment by segment from the left: at the first position where
//! they differ, an exact segment beats a parameter, which beats the wildcard.
//! If one route is a prefix of the other (in segment kinds), the shorter one
//! wins (so `/foo` beats `/foo/...` for `/foo`); a full tie goes to the route
//! listed first in the manifest. Consequences: exact routes beat wildcards, and
//! the wildcard with the longest prefix wins.
//!
//! Paths are compared with leading and trailing slashes trimmed and runs of
//! slashes between segments treated as one, so `/foo/` matches the route
//! `/foo`. The trailing-wildcard part of the path (`spin-path-info`) keeps a
//! trailing slash, as Spin always has: route `/test/...` gives `""` for
//! `/test`, `"/"` for `/test/`, `"/hello"` for `/test/hello` and `"/hello/"`
//! for `/test/hello/`.
//!
//! If the same route is given to two components, the later one wins (as in
//! Spin), and [`Router::duplicates`] reports it.

use std::cmp::Ordering;
use std::fmt;

/// One segment of a parsed route.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Exact(String),
    Param(String),
}

impl Segment {
    fn rank(&self) -> u8 {
        match self {
            Segment::Exact(_) => 2,
            Segment::Param(_) => 1,
        }
    }
}

/// A route as written in the manifest, parsed.
#[derive(Clone, Debug)]
struct RouteEntry {
    component: String,
    /// As written in the manifest (`spin-raw-component-route`).
    raw: String,
    /// Absolutised, one trailing slash removed (`spin-matched-route`).
    based: String,
    segments: Vec<Segment>,
    wildcard: bool,
}

impl RouteEntry {
    /// Rank sequence used for precedence: 2 = exact, 1 = param, 0 = wildcard.
    fn ranks(&self) -> impl Iterator<Item = u8> + '_ {
        self.segments
            .iter()
            .map(Segment::rank)
            .chain(self.wildcard.then_some(0))
    }

    fn len(&self) -> usize {
        self.segments.len() + usize::from(self.wildcard)
    }

    /// `Less` means `self` takes precedence over `other`.
    fn precedence(&self, other: &Self) -> Ordering {
        for (mine, theirs) in self.ranks().zip(other.ranks()) {
            match theirs.cmp(&mine) {
                Ordering::Equal => continue,
                decided => return decided,
            }
        }
        self.len().cmp(&other.len())
    }
}

/// A route that was given to two components; the later one wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateRoute {
    pub route: String,
    pub replaced_component: String,
    pub effective_component: String,
}

/// Error in a route pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteError {
    pub route: String,
    pub component: String,
    pub reason: String,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route {:?} of component {:?}: {}",
            self.route, self.component, self.reason
        )
    }
}

impl std::error::Error for RouteError {}

/// The routing table of an app.
#[derive(Clone, Debug, Default)]
pub struct Router {
    /// Sorted by precedence, most specific first.
    routes: Vec<RouteEntry>,
    duplicates: Vec<DuplicateRoute>,
}

/// The result of routing a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMatch {
    /// The component that handles the request.
    pub component: String,
    /// The route as written in the manifest (`spin-raw-component-route`).
    pub raw_route: String,
    /// The route as Spin normalises it (`spin-matched-route`).
    pub based_route: String,
    /// The route without a trailing `/...` (`spin-component-route`).
    pub component_route: String,
    /// Named parameters, in route order, names as written.
    pub params: Vec<(String, String)>,
    /// The part of the path matched by a trailing wildcard (`spin-path-info`);
    /// empty for routes without one.
    pub path_info: String,
}

impl Router {
    /// Builds a router from `(route, component)` pairs in manifest order.
    pub fn build<'a>(
        routes: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, RouteError> {
        let mut entries: Vec<RouteEntry> = Vec::new();
        let mut duplicates = Vec::new();
        for (raw, component) in routes {
            let entry = parse_route(raw, component)?;
            if let Some(existing) = entries.iter_mut().find(|e| e.raw == entry.raw) {
                duplicates.push(DuplicateRoute {
                    route: entry.raw.clone(),
                    replaced_component: existing.component.clone(),
                    effective_component: entry.component.clone(),
                });
                // Spin keeps the first position and the last component.
                existing.component = entry.component;
            } else {
                entries.push(entry);
            }
        }
        // A stable sort keeps manifest order among routes of equal precedence.
        entries.sort_by(|a, b| a.precedence(b));
        Ok(Self {
            routes: entries,
            duplicates,
        })
    }

    /// The router of a manifest's HTTP triggers (private ones have no route).
    pub fn for_manifest(manifest: &crate::manifest::Manifest) -> anyhow::Result<Self> {
        let routes = manifest
            .http_triggers
            .iter()
            .filter_map(|t| t.route.as_deref().map(|r| (r, t.component.as_str())));
        Self::build(routes).map_err(|e| anyhow::anyhow!("{}: {e}", manifest.path.display()))
    }

    /// Routes given to more than one component.
    pub fn duplicates(&self) -> &[DuplicateRoute] {
        &self.duplicates
    }

    /// `(route for display, component)` in precedence order, as `spin up`
    /// lists them: wildcard routes as `<prefix> (wildcard)`.
    pub fn routes(&self) -> impl Iterator<Item = (String, &str)> {
        self.routes.iter().map(|e| {
            let shown = if e.wildcard {
                format!(
                    "{} (wildcard)",
                    e.based.strip_suffix("/...").unwrap_or(&e.based)
                )
            } else {
                e.based.clone()
            };
            (shown, e.component.as_str())
        })
    }

    /// Routes a request path (without query). `None` means 404.
    pub fn route(&self, path: &str) -> Option<RouteMatch> {
        let trimmed = path.trim_matches('/');
        self.routes
            .iter()
            .find_map(|entry| match_entry(entry, trimmed, path.ends_with('/')))
    }
}

fn match_entry(entry: &RouteEntry, trimmed: &str, trailing_slash: bool) -> Option<RouteMatch> {
    let mut rest = trimmed;
    let mut params = Vec::new();
    for segment in &entry.segments {
        rest = rest.trim_start_matches('/');
        let end = rest.find('/').unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(end);
        if piece.is_empty() {
            return None;
        }
        match segment {
            Segment::Exact(text) if text == piece => {}
            Segment::Exact(_) => return None,
            Segment::Param(name) => params.push((name.clone(), piece.to_string())),
        }
        rest = tail;
    }
    let rest = rest.trim_start_matches('/');
    let path_info = if entry.wildcard {
        match (rest.is_empty(), trailing_slash) {
            (true, false) => String::new(),
            (true, true) => "/".to_string(),
            (false, false) => format!("/{rest}"),
            (false, true) => format!("/{rest}/"),
        }
    } else if rest.is_empty() {
        String::new()
    } else {
        return None;
    };
    Some(RouteMatch {
        component: entry.component.clone(),
        raw_route: entry.raw.clone(),
        based_route: entry.based.clone(),
        component_route: entry
            .raw
            .strip_suffix("/...")
            .unwrap_or(&entry.raw)
            .to_string(),
        params,
        path_info,
    })
}

fn parse_route(raw: &str, component: &str) -> Result<RouteEntry, RouteError> {
    let error = |reason: String| RouteError {
        route: raw.to_string(),
        component: component.to_string(),
        reason,
    };
    // Spin: make absolute, then strip a single trailing slash.
    let absolute = if raw.starts_with('/') {
        raw.to_string()
    } else {
        format!("/{raw}")
    };
    let based = absolute
        .strip_suffix('/')
        .map(str::to_string)
        .unwrap_or(absolute);
    let (pattern, wildcard) = if let Some(prefix) = based.strip_suffix("/...") {
        (prefix, true)
    } else if let Some(prefix) = based.strip_suffix("/*") {
        (prefix, true)
    } else {
        (based.as_str(), false)
    };
    let mut segments = Vec::new();
    for piece in pattern.split('/').filter(|p| !p.is_empty()) {
        if piece == "..." || piece.starts_with('*') {
            return Err(error(
                "a wildcard (`/...`) may only end a route".to_string(),
            ));
        }
        if let Some(name) = piece.strip_prefix(':') {
            if name.is_empty() {
                return Err(error("parameters must be named (`:name`)".to_string()));
            }
            segments.push(Segment::Param(name.to_string()));
        } else {
            segments.push(Segment::Exact(piece.to_string()));
        }
    }
    Ok(RouteEntry {
        component: component.to_string(),
        raw: raw.to_string(),
        based,
        segments,
        wildcard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(routes: &[(&str, &str)]) -> Router {
        Router::build(routes.iter().copied()).expect("routes parse")
    }

    fn component(r: &Router, path: &str) -> Option<String> {
        r.route(path).map(|m| m.component)
    }

    #[test]
    fn exact_routes() {
        let r = router(&[("/foo", "foo"), ("/foo/bar", "foobar")]);
        assert_eq!(component(&r, "/foo").as_deref(), Some("foo"));
        assert_eq!(component(&r, "/foo/bar").as_deref(), Some("foobar"));
        assert_eq!(component(&r, "/foo/baz"), None);
        assert_eq!(component(&r, "/foobar"), None);
        assert_eq!(component(&r, "/"), None);
    }

    #[test]
    fn no_route_is_none() {
        let r = router(&[("/v1/healthz", "meta")]);
        assert_eq!(r.route("/v1/other"), None);
        assert_eq!(r.route("/"), None);
        assert_eq!(Router::default().route("/anything"), None);
    }

    #[test]
    fn trailing_slash_on_exact_route_is_ignored() {
        let r = router(&[("/foo", "foo"), ("/bar/", "bar")]);
        assert_eq!(component(&r, "/foo/").as_deref(), Some("foo"));
        assert_eq!(component(&r, "/bar").as_deref(), Some("bar"));
        assert_eq!(component(&r, "/bar/").as_deref(), Some("bar"));
        let m = r.route("/bar").unwrap();
        assert_eq!(m.raw_route, "/bar/");
        assert_eq!(m.based_route, "/bar");
    }

    #[test]
    fn repeated_slashes_collapse() {
        let r = router(&[("/a/b", "ab")]);
        assert_eq!(component(&r, "//a//b//").as_deref(), Some("ab"));
    }

    #[test]
    fn root_route() {
        let r = router(&[("/", "root")]);
        assert_eq!(component(&r, "/").as_deref(), Some("root"));
        assert_eq!(component(&r, ""), Some("root".to_string()));
        assert_eq!(component(&r, "/x"), None);
        assert_eq!(r.route("/").unwrap().based_route, "");
    }

    #[test]
    fn params_capture_one_segment() {
        let r = router(&[("/v1/nodes/:nodeId/reservations/:id/release", "c")]);
        let m = r.route("/v1/nodes/n1/reservations/r1/release").unwrap();
        assert_eq!(
            m.params,
            vec![
                ("nodeId".to_string(), "n1".to_string()),
                ("id".to_string(), "r1".to_string())
            ]
        );
        assert_eq!(m.path_info, "");
        assert_eq!(
            m.component_route,
            "/v1/nodes/:nodeId/reservations/:id/release"
        );
        assert_eq!(r.route("/v1/nodes/n1/reservations/release"), None);
        assert_eq!(r.route("/v1/nodes/n1/reservations/r1/release/x"), None);
    }

    #[test]
    fn wildcard_matches_zero_or_more_segments() {
        let r = router(&[("/...", "all")]);
        for path in ["/", "/foo/bar", "/abc/", "/this/should/be/captured"] {
            assert_eq!(component(&r, path).as_deref(), Some("all"), "{path}");
        }
        let m = r.route("/foo/bar").unwrap();
        assert_eq!(m.path_info, "/foo/bar");
        assert_eq!(m.based_route, "/...");
        assert_eq!(m.raw_route, "/...");
        assert_eq!(m.component_route, "");
    }

    #[test]
    fn star_is_a_wildcard_too() {
        let r = router(&[("/static/*", "files")]);
        let m = r.route("/static/a/b.css").unwrap();
        assert_eq!(m.path_info, "/a/b.css");
    }

    #[test]
    fn wildcard_path_info_respects_trailing_slash() {
        let r = router(&[("/test/...", "c")]);
        assert_eq!(r.route("/test").unwrap().path_info, "");
        assert_eq!(r.route("/test/").unwrap().path_info, "/");
        assert_eq!(r.route("/test/hello").unwrap().path_info, "/hello");
        assert_eq!(r.route("/test/hello/").unwrap().path_info, "/hello/");
        assert_eq!(r.route("/1/2/3"), None);
        let r = router(&[("/...", "c")]);
        assert_eq!(r.route("/").unwrap().path_info, "/");
        assert_eq!(r.route("/1/2/3").unwrap().path_info, "/1/2/3");
        let r = router(&[("/1/...", "c")]);
        assert_eq!(r.route("/1/2/3").unwrap().path_info, "/2/3");
        assert_eq!(r.route("/1//2").unwrap().path_info, "/2");
    }

    #[test]
    fn params_before_wildcard() {
        let r = router(&[("/foo/:userid/...", "c")]);
        let m = r.route("/foo/42/bar").unwrap();
        assert_eq!(m.params, vec![("userid".to_string(), "42".to_string())]);
        assert_eq!(m.path_info, "/bar");
        assert_eq!(m.component_route, "/foo/:userid");
        assert_eq!(m.based_route, "/foo/:userid/...");
    }

    #[test]
    fn exact_beats_wildcard_regardless_of_order() {
        for routes in [
            [("/one", "one_exact"), ("/...", "wildcard")],
            [("/...", "wildcard"), ("/one", "one_exact")],
        ] {
            let r = router(&routes);
            assert_eq!(component(&r, "/one").as_deref(), Some("one_exact"));
            assert_eq!(component(&r, "/two").as_deref(), Some("wildcard"));
        }
    }

    #[test]
    fn exact_beats_param_beats_wildcard() {
        let r = router(&[
            ("/prec/...", "wild"),
            ("/prec/:name", "param"),
            ("/prec/exact", "exact"),
        ]);
        assert_eq!(component(&r, "/prec/exact").as_deref(), Some("exact"));
        assert_eq!(component(&r, "/prec/other").as_deref(), Some("param"));
        assert_eq!(component(&r, "/prec/other/deeper").as_deref(), Some("wild"));
        // `/prec/...` also matches `/prec` itself (empty path-info).
        assert_eq!(component(&r, "/prec").as_deref(), Some("wild"));
    }

    #[test]
    fn exact_route_beats_wildcard_with_same_prefix() {
        let r = router(&[("/foo/...", "wild"), ("/foo", "exact")]);
        assert_eq!(component(&r, "/foo").as_deref(), Some("exact"));
        assert_eq!(component(&r, "/foo/x").as_deref(), Some("wild"));
    }

    #[test]
    fn longest_wildcard_prefix_wins() {
        let all = [
            ("/one/...", "one"),
            ("/one/two/...", "onetwo"),
            ("/one/two/three/...", "onetwothree"),
        ];
        let mut reversed = all;
        reversed.reverse();
        for routes in [all, reversed] {
            let r = router(&routes);
            assert_eq!(
                component(&r, "/one/two/three/four").as_deref(),
                Some("onetwothree")
            );
            assert_eq!(component(&r, "/one/two/x").as_deref(), Some("onetwo"));
            assert_eq!(component(&r, "/one/x").as_deref(), Some("one"));
        }
    }

    #[test]
    fn earlier_position_decides_before_length() {
        // `/a/:x/c` has an exact segment where `/:y/b/c` has a parameter.
        let r = router(&[("/:y/b/c", "param-first"), ("/a/:x/c", "exact-first")]);
        assert_eq!(component(&r, "/a/b/c").as_deref(), Some("exact-first"));
        // A param with more segments beats a wildcard with fewer.
        let r = router(&[("/a/...", "wild"), ("/a/:x/:y", "params")]);
        assert_eq!(component(&r, "/a/1/2").as_deref(), Some("params"));
        assert_eq!(component(&r, "/a/1/2/3").as_deref(), Some("wild"));
    }

    #[test]
    fn equal_precedence_goes_to_manifest_order() {
        let r = router(&[("/x/:a", "first"), ("/x/:b", "second")]);
        assert_eq!(component(&r, "/x/1").as_deref(), Some("first"));
        let r = router(&[("/x/:b", "second"), ("/x/:a", "first")]);
        assert_eq!(component(&r, "/x/1").as_deref(), Some("second"));
    }

    #[test]
    fn duplicate_route_last_one_wins() {
        let r = router(&[("/foo", "first"), ("/bar", "bar"), ("/foo", "second")]);
        assert_eq!(component(&r, "/foo").as_deref(), Some("second"));
        assert_eq!(
            r.duplicates(),
            &[DuplicateRoute {
                route: "/foo".to_string(),
                replaced_component: "first".to_string(),
                effective_component: "second".to_string(),
            }]
        );
    }

    #[test]
    fn relative_route_is_made_absolute() {
        let r = router(&[("foo", "c")]);
        assert_eq!(component(&r, "/foo").as_deref(), Some("c"));
        assert_eq!(r.route("/foo").unwrap().based_route, "/foo");
    }

    #[test]
    fn captures_are_not_percent_decoded() {
        let r = router(&[("/u/:name", "c")]);
        assert_eq!(r.route("/u/a%20b").unwrap().params[0].1, "a%20b");
    }

    #[test]
    fn bad_routes_are_rejected() {
        for bad in ["/a/.../b", "/:", "/a/:/b", "/*named", "/a/*x/b"] {
            let err = Router::build([(bad, "c")]).expect_err(bad);
            assert_eq!(err.route, bad);
        }
    }

    #[test]
    fn routes_are_listed_like_spin_up() {
        let r = router(&[("/...", "all"), ("/hello", "hello"), ("/files/...", "f")]);
        let listed: Vec<(String, String)> = r
            .routes()
            .map(|(route, c)| (route, c.to_string()))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("/hello".to_string(), "hello".to_string()),
                ("/files (wildcard)".to_string(), "f".to_string()),
                (" (wildcard)".to_string(), "all".to_string()),
            ]
        );
    }
}
