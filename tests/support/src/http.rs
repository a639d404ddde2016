//! A small blocking HTTP client for the host's own suites, which talk to the probe rather
//! than to the app (the app's suites use `api_client`, which checks the OpenAPI document).

use std::sync::OnceLock;

/// A response, fully read: the app suites' own, without their OpenAPI check.
pub use api_client::Reply;

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build();
        ureq::Agent::new_with_config(config)
    })
}

fn reply(result: Result<http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = result.expect("HTTP request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.body_mut().read_to_vec().expect("read body");
    Reply {
        status,
        headers,
        body,
    }
}

pub fn get(url: &str) -> Reply {
    reply(agent().get(url).call())
}

pub fn get_with(url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = agent().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    reply(req.call())
}

pub fn post(url: &str, body: impl AsRef<[u8]>) -> Reply {
    reply(agent().post(url).send(body.as_ref()))
}

pub fn post_json(url: &str, body: &serde_json::Value) -> Reply {
    reply(
        agent()
            .post(url)
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes()),
    )
}
