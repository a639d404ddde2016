//! The capacity console: one page (HTML, CSS and plain JS modules, all embedded here) that
//! shows the occupancy of a node and acts on it through the public API, with an API key the
//! person pastes. The component only serves files: it reads no state and knows no key, so
//! every caller gets the same bytes and the page shows exactly what the pasted key may see.
//!
//! Every answer (files and refusals alike) carries a Content-Security-Policy that allows
//! scripts, styles, images and API calls from the page's own origin only, with no inline
//! script or style, plus `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.

use reservations_http::render::problem_response;
use reservations_http::routes::PathParams;
use reservations_http::routes::fresh_request_id;
use reservations_http::{Incoming, Problem, routes, serve};
use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// Only the page's own origin, for everything; no inline code (neither `'unsafe-inline'`
/// nor `'unsafe-eval'`), no plugins, no `<base>`, no form submissions, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A file of the console: its name under `/console/`, its type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The page (served at `/console` and `/console/`) and everything it loads.
const PAGE: Asset = Asset {
    name: "",
    content_type: HTML,
    body: include_bytes!("../static/index.html"),
};

const ASSETS: &[Asset] = &[
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../static/console.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../static/icon.svg"),
    },
    Asset {
        name: "js/main.js",
        content_type: JS,
        body: include_bytes!("../static/js/main.js"),
    },
    Asset {
        name: "js/api.js",
        content_type: JS,
        body: include_bytes!("../static/js/api.js"),
    },
    Asset {
        name: "js/dom.js",
        content_type: JS,
        body: include_bytes!("../static/js/dom.js"),
    },
    Asset {
        name: "js/occupancy.js",
        content_type: JS,
        body: include_bytes!("../static/js/occupancy.js"),
    },
    Asset {
        name: "js/map.js",
        content_type: JS,
        body: include_bytes!("../static/js/map.js"),
    },
    Asset {
        name: "js/panels.js",
        content_type: JS,
        body: include_bytes!("../static/js/panels.js"),
    },
];

#[http_component]
fn handle(incoming: Incoming) -> Response {
    // Refusals too (404, and the 405 that `serve` renders) carry the page's headers.
    let mut response = serve(routes!("console"; console_file: page, named_file), incoming);
    for (name, value) in security_headers() {
        response.set_header(name, value);
    }
    response
}

/// `/console`: the page.
fn page(request: &Request, _: &PathParams) -> Response {
    file(request, Some(&PAGE))
}

/// `/console/<name>`: a file of [`ASSETS`], the page for `/console/`, else 404.
fn named_file(request: &Request, params: &PathParams) -> Response {
    let name = params.wildcard().unwrap_or_default();
    let asset = if name.is_empty() {
        Some(&PAGE)
    } else {
        ASSETS.iter().find(|asset| asset.name == name)
    };
    file(request, asset)
}

fn file(request: &Request, asset: Option<&Asset>) -> Response {
    let request_id = fresh_request_id();
    match asset {
        Some(asset) => Response::builder()
            .status(200)
            .header("content-type", asset.content_type)
            // Revalidated on every load, so a new build is never mixed with cached modules.
            .header("cache-control", "no-cache")
            .header("x-request-id", request_id.as_str())
            .body(asset.body.to_vec())
            .build(),
        None => problem_response(
            &Problem::not_found(format!("the console has no file {}", request.path())),
            &request_id,
            request.path(),
        ),
    }
}

/// The headers every answer of the console carries.
fn security_headers() -> [(&'static str, &'static str); 4] {
    [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_loads_is_served() {
        let page = std::str::from_utf8(PAGE.body).unwrap();
        for asset in ASSETS {
            assert!(!asset.body.is_empty(), "{} is empty", asset.name);
        }
        // Every `/console/...` reference of the page and of the modules names a served file.
        let mut texts = vec![page];
        texts.extend(
            ASSETS
                .iter()
                .filter(|a| a.content_type == JS)
                .map(|a| std::str::from_utf8(a.body).unwrap()),
        );
        for text in texts {
            for reference in text.split("/console/").skip(1) {
                let name: String = reference
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "._-/".contains(*c))
                    .collect();
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "/console/{name} is referenced but not served"
                );
            }
            for import in text.split("from './").skip(1) {
                let name = format!("js/{}", &import[..import.find('\'').unwrap()]);
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{name} is imported but not served"
                );
            }
        }
    }

    #[test]
    fn no_module_parses_strings_as_html() {
        for asset in ASSETS.iter().filter(|a| a.content_type == JS) {
            let code = std::str::from_utf8(asset.body).unwrap();
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!code.contains(sink), "{} uses {sink}", asset.name);
            }
        }
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let page = std::str::from_utf8(PAGE.body).unwrap();
        for forbidden in ["<style", "style=", "javascript:"] {
            assert!(!page.contains(forbidden), "the page contains {forbidden:?}");
        }
        // No event-handler attributes (` onclick=` and the like).
        for (at, _) in page.match_indices(" on") {
            let name: String = page[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            assert!(
                !page[at + 1 + name.len()..].starts_with('='),
                "an inline handler: {name}"
            );
        }
        for script in page.split("<script").skip(1) {
            let tag = &script[..script.find('>').unwrap()];
            assert!(tag.contains("src=\"/console/"), "an inline script: {tag}");
        }
    }
}
