//! Bearer tokens: malformed and unknown ones refused alike, whoami, and the operator token unset.

use super::*;

/// Header values that are not `Bearer <token>`, each refused with the same 401.
#[test]
fn malformed_authorization_headers_are_refused_with_a_bearer_challenge() {
    let app = App::start();
    let (_, token) = acme_viewer_key(&app);
    let (head, tail) = token.split_at(20);
    let anonymous = app.anonymous();

    let problem = expect_unauthorized(anonymous.get("/v1/whoami"));
    assert_eq!(problem["instance"], "/v1/whoami");
    for header in [
        format!("Basic {token}"),
        format!("Token {token}"),
        token.clone(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Bearer  {token}"),
        format!("Bearer\t{token}"),
        format!("Bearer {token} junk"),
        format!("Bearer {token},Bearer {token}"),
        format!("Bearer {head} {tail}"),
        format!("Bearer {head}\t{tail}"),
        format!("Bearer \"{token}\""),
        format!("Bearer {token}!"),
        format!("Bearer {}", OPERATOR_TOKEN.replace('-', " ")),
    ] {
        let reply = anonymous.with_authorization(&header).get("/v1/whoami");
        assert_eq!(reply.status, 401, "{header:?} was accepted");
        expect_unauthorized(reply);
    }
    // The scheme is case-insensitive (RFC 7235).
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let me = anonymous
            .with_authorization(&format!("{scheme} {token}"))
            .get("/v1/whoami")
            .expect_status(200)
            .json();
        assert_eq!(me["orgId"], "acme", "{scheme}");
    }
}

#[test]
fn unknown_tokens_are_refused_alike() {
    let app = App::start();
    let (created, token) = acme_viewer_key(&app);
    let key_id = created["id"].as_str().unwrap();
    let secret = token.rsplit('.').next().unwrap();
    let mut flipped = secret.to_owned().into_bytes();
    flipped[10] = if flipped[10] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).unwrap();
    let mut details = BTreeSet::new();
    for unknown in [
        "nonsense".to_owned(),
        format!("gpr.{key_id}.{flipped}"),
        format!("gpr.{key_id}.{}", &secret[..63]),
        format!("gpr.{key_id}.{secret}0"),
        format!("gpr.key-0000000000000000.{secret}"),
        format!("gpx.{key_id}.{secret}"),
        format!("gpr.{key_id}"),
        format!("{OPERATOR_TOKEN}x"),
        OPERATOR_TOKEN[1..].to_owned(),
        secret.to_owned(),
    ] {
        let problem = expect_unauthorized(app.client(&unknown).get("/v1/whoami"));
        details.insert(problem["detail"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        details.len(),
        1,
        "every unknown token gets the same answer: {details:?}"
    );
    app.client(&token).get("/v1/whoami").expect_status(200);
}

#[test]
fn whoami_describes_the_caller() {
    let app = App::start();
    app.org("acme");
    let operator = app.operator().get("/v1/whoami").expect_status(200).json();
    assert_eq!(operator["operator"], true);
    assert_eq!(operator["orgId"], Value::Null);
    assert_eq!(operator["keyId"], "operator");
    // Everything but vm.write: the operator places no VMs (it has no org to run them for).
    let mut usable: Vec<&str> = ROLE_PERMISSIONS[0].1.to_vec();
    usable.retain(|p| *p != "vm.write");
    assert_eq!(strings(&operator["permissions"]), sorted(&usable));
    app.operator()
        .post(
            "/v1/vms",
            &json!({ "nodeId": "n1", "unitIds": ["u1"], "tier": "spot" }),
        )
        .expect_problem(403, "forbidden");

    let (created, key) = create_key(
        &app,
        &app.operator(),
        "acme",
        json!({ "name": "k", "role": "capacity-manager", "permissions": ["node.read", "audit.read"] }),
    );
    let me = key.get("/v1/whoami").expect_status(200).json();
    assert_eq!(me["keyId"], created["id"]);
    assert_eq!(me["orgId"], "acme");
    assert_eq!(me["operator"], false);
    assert_eq!(strings(&me["permissions"]), ["audit.read", "node.read"]);
    assert_eq!(me.as_object().unwrap().len(), 4, "{me}");
    let reply = key.get("/v1/whoami");
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    expect_unauthorized(app.anonymous().get("/v1/whoami"));
}

#[test]
fn an_empty_operator_token_refuses_authenticated_routes_and_health_is_not_ready() {
    for unset in ["", "   "] {
        let app = App::start_with(|c| c.env("SPIN_VARIABLE_OPERATOR_TOKEN", unset));
        // Health says the app is not ready, with the same problem the other routes answer.
        let health = app
            .anonymous()
            .get("/v1/healthz")
            .expect_problem(503, "operator-token-unset");
        assert!(
            health["detail"]
                .as_str()
                .unwrap()
                .contains("SPIN_VARIABLE_OPERATOR_TOKEN"),
            "{health}"
        );
        app.anonymous().get("/v1/openapi.json").expect_status(200);
        for client in [
            app.anonymous(),
            app.client("anything"),
            app.anonymous()
                .with_authorization(&format!("Bearer {unset}")),
        ] {
            for (method, path) in [
                ("GET", "/v1/whoami"),
                ("POST", "/v1/orgs"),
                ("GET", "/v1/nodes"),
                ("GET", "/v1/vms"),
                ("GET", "/v1/audit"),
                ("POST", "/v1/nodes/n1/reservations/r1/release"),
            ] {
                let reply = client.send(method, path, Some("application/json"), Some(b"{}"));
                let problem = reply.expect_problem(503, "operator-token-unset");
                assert!(
                    problem["detail"]
                        .as_str()
                        .unwrap()
                        .contains("SPIN_VARIABLE_OPERATOR_TOKEN"),
                    "{problem}"
                );
            }
        }
    }
}

#[test]
fn a_home_url_that_is_not_an_origin_refuses_authenticated_routes_and_health_is_not_ready() {
    for wrong in [
        "home.internal:3000",
        "ftp://home.internal",
        "http://home.internal/v1",
    ] {
        let app = App::start_on_local_files_with(|c| c.env("SPIN_VARIABLE_HOME_URL", wrong));
        let health = app
            .anonymous()
            .get("/v1/healthz")
            .expect_problem(503, "home-url-misconfigured");
        assert!(
            health["detail"]
                .as_str()
                .unwrap()
                .contains("SPIN_VARIABLE_HOME_URL"),
            "{health}"
        );
        for (method, path) in [
            ("GET", "/v1/whoami"),
            ("POST", "/v1/orgs"),
            ("POST", "/v1/nodes/n1/reservations/r1/release"),
        ] {
            app.operator()
                .send(method, path, Some("application/json"), Some(b"{}"))
                .expect_problem(503, "home-url-misconfigured");
        }
    }
}

#[test]
fn without_the_operator_token_variable_the_host_refuses_to_start() {
    api_support::ensure_components_built();
    let state = TempDir::new("no-operator-token");
    let config = HostConfig::new(workspace().join("spin.toml")).state_dir(state.path());
    let error = match Host::start(config) {
        Ok(_) => panic!("the app started without an operator credential"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("operator_token"), "{error}");
    assert!(error.contains("SPIN_VARIABLE_OPERATOR_TOKEN"), "{error}");
}
