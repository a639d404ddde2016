"""The Kubernetes manifests in deploy/, checked without a cluster.

1. Every object validates against its schema: the built-in kinds against Kubernetes' own
   OpenAPI schemas as the kubernetes-validate package ships them (strict: an unknown field
   fails), for the oldest and the newest Kubernetes it is checked against; SpinApp against
   deploy/schemas/spinapp-v1alpha1.json. A kind with no schema fails.
2. The objects fit together and fit the app: every Service selects pods of a workload and
   names ports they have; every Secret key that is referenced exists; the runtime config in
   its Secret is TOML that puts the database on libSQL and the key-value store on Redis at
   the Services' addresses; every SpinApp binds every required variable of spin.toml (the
   audit key from one Secret for all), probes readiness on /v1/healthz and liveness on a
   public route that touches no store, and is autoscaled by a HorizontalPodAutoscaler aimed
   at its Deployment; the primary sqld runs with --checkpoint-interval-s and a liveness probe
   that writes.
   Edge sites (deploy/sites.yaml): sqld's command line is what the image's entrypoint makes
   of the container's args and env (sqld_argv); the primary has --grpc-listen-addr on a
   port its Service exposes, each read replica's --primary-grpc-url is that Service port and
   the replica checks tokens with the primary's key; a NetworkPolicy admits only replicas to
   the gRPC port; exactly one SpinApp is on the primary (it migrates the schema), and each
   site's SpinApp (label site) has its database on its site's replica and its Redis at its
   site.
3. sqld's liveness probe, the script itself, run against a real sqld (the one scripts/stores
   installs): it passes while sqld serves writes and has written its row, and fails when
   sqld does not answer in time (stopped with SIGSTOP) and when nothing listens.
4. The market in cells (deploy/cells/, applied after the rest): the runtime config maps
   every label the cells' manifest (scripts/cells-manifest) grants, the directory's on the
   primary, each other cell's on its own pod of a headless Service's StatefulSet, each a
   primary with the primary's flags, liveness probe and JWT key.
5. The primary and a site's replica, run with the command lines and env of their manifests
   (addresses moved to loopback, the Secret's JWT key replaced by a fresh one): every flag is
   one `sqld --help` lists, the replica refuses a write without a token, forwards one with a
   token to the primary and then serves it from its copy, and the primary's liveness probe
   passes with a token and fails without one.

    python validate.py REPO_ROOT SQLD_BINARY
Prints 'N passed, N failed' last.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import urllib.error
import urllib.request
from typing import Any, Callable

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

VERSIONS = ["1.30.0", all_versions()[-1]]
KINDS_IN_REPO = {("core.spinkube.dev/v1alpha1", "SpinApp"): "deploy/schemas/spinapp-v1alpha1.json"}
# The namespace the manifests' comments create; in-cluster URLs name Services in it.
NAMESPACE = "gpu-reservations"
SQLD_IMAGE = "ghcr.io/tursodatabase/libsql-server:"


def load(root: str, folder: str = "deploy") -> list[tuple[str, dict[str, Any]]]:
    objects = []
    for path in sorted(glob.glob(os.path.join(root, folder, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    objects.append((os.path.relpath(path, root), doc))
    return objects


def check_schemas(root: str, objects: list[tuple[str, dict[str, Any]]]) -> None:
    for path, obj in objects:
        what = f"{path}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        in_repo = KINDS_IN_REPO.get((obj.get("apiVersion"), obj.get("kind")))
        if in_repo:
            with open(os.path.join(root, in_repo)) as f:
                schema = json.load(f)
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=str)
            assert not errors, f"{what}: " + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
            print(f"  {what}: valid against {in_repo}")
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError as error:
                raise AssertionError(f"{what}: no schema ({error.message})") from error
            except kubernetes_validate.ValidationError as error:
                raise AssertionError(f"{what}: {list(error.path)}: {error.message} (Kubernetes {version})") from error
        print(f"  {what}: valid (strict) for Kubernetes {' and '.join(VERSIONS)}")


def by_kind(objects: list[tuple[str, dict[str, Any]]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for _, o in objects if o["kind"] == kind}


def secret_value(secrets: dict[str, dict[str, Any]], name: str, key: str) -> str:
    assert name in secrets, f"Secret {name} is referenced but not defined"
    data = secrets[name].get("stringData", {})
    assert key in data, f"Secret {name} has no key {key}"
    return str(data[key])


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def sqld_argv(container: dict[str, Any]) -> list[str]:
    """sqld's command line in the libsql-server image: its entrypoint (docker-entrypoint.sh
    of v0.24.32) appends --db-path and --http-listen-addr to the args, then by SQLD_NODE
    --grpc-listen-addr (primary, the default) or --primary-grpc-url $SQLD_PRIMARY_URL
    (replica), nothing more for standalone."""
    assert "command" not in container, "the image's entrypoint builds sqld's command line"
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    argv = list(container.get("args") or ["/bin/sqld"])
    assert argv[0] == "/bin/sqld", argv
    argv += ["--db-path", env.get("SQLD_DB_PATH", "iku.db")]
    argv += ["--http-listen-addr", env.get("SQLD_HTTP_LISTEN_ADDR", "0.0.0.0:8080")]
    node = env.get("SQLD_NODE", "primary")
    if node == "primary":
        argv += ["--grpc-listen-addr", env.get("SQLD_GRPC_LISTEN_ADDR", "0.0.0.0:5001")]
    elif node == "replica":
        assert "SQLD_PRIMARY_URL" in env, "a replica needs SQLD_PRIMARY_URL (the entrypoint runs with set -u)"
        argv += ["--primary-grpc-url", env["SQLD_PRIMARY_URL"]]
    else:
        assert node == "standalone", node
    return argv


def flag(argv: list[str], name: str) -> str | None:
    """The value of `name` in argv; sqld refuses a flag given twice, and so does this."""
    at = [i for i, a in enumerate(argv) if a == name]
    assert len(at) <= 1, f"{name} given {len(at)} times: {argv}"
    return argv[at[0] + 1] if at else None


def url_service(url: str, services: dict[str, dict[str, Any]]) -> tuple[str, int]:
    """The Service an in-cluster URL names (`<name>` or `<name>.<NAMESPACE>.svc.cluster.local`),
    and the port, which the Service must expose."""
    host = url.split("://", 1)[1].split("/", 1)[0]
    name, _, port = host.rpartition(":")
    service = name.split(".", 1)[0]
    assert name in (service, f"{service}.{NAMESPACE}.svc.cluster.local"), f"{url}: not a Service in {NAMESPACE}"
    assert service in services, f"{url}: no Service {service}"
    assert any(p["port"] == int(port) for p in services[service]["spec"]["ports"]), f"{url}: Service {service} has no port {port}"
    return service, int(port)


def check_wiring(root: str, objects: list[tuple[str, dict[str, Any]]]) -> None:
    secrets = by_kind(objects, "Secret")
    services = by_kind(objects, "Service")
    workloads = {**by_kind(objects, "Deployment"), **by_kind(objects, "StatefulSet")}
    spinapps = by_kind(objects, "SpinApp")
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    policies = by_kind(objects, "NetworkPolicy")
    assert spinapps, "no SpinApp"

    # Services select a workload's pods and name its ports.
    selected: dict[str, str] = {}
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matching = [w for w, workload in workloads.items() if selector.items() <= pod_labels(workload).items()]
        assert len(matching) == 1, f"Service {name} selects {len(matching)} workloads"
        selected[name] = matching[0]
        ports = {p["name"] for c in containers(workloads[matching[0]]) for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: no container port {port['targetPort']}"
    for name, workload in workloads.items():
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels(workload).items(), name
        for container in containers(workload):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret_value(secrets, ref["name"], ref["key"])

    # sqld: one primary, with a gRPC listener its Service exposes; read replicas pointed at
    # that Service port, checking tokens with the primary's key.
    sqlds = {n: w for n, w in workloads.items() if containers(w)[0]["image"].startswith(SQLD_IMAGE)}
    argvs = {n: sqld_argv(containers(w)[0]) for n, w in sqlds.items()}
    for name, argv in argvs.items():
        http_port = int(flag(argv, "--http-listen-addr").rpartition(":")[2])
        assert {"name": "http", "containerPort": http_port} in containers(sqlds[name])[0]["ports"], (name, http_port)
    primaries = [n for n, argv in argvs.items() if flag(argv, "--grpc-listen-addr")]
    assert len(primaries) == 1, f"one primary sqld (with --grpc-listen-addr), not {primaries}"
    primary = primaries[0]
    primary_container = containers(sqlds[primary])[0]
    assert flag(argvs[primary], "--primary-grpc-url") is None, "the primary replicates from nobody"
    grpc_port = int(flag(argvs[primary], "--grpc-listen-addr").rpartition(":")[2])
    assert {"name": "grpc", "containerPort": grpc_port} in primary_container["ports"], primary_container["ports"]
    primary_services = [n for n, w in selected.items() if w == primary]
    assert len(primary_services) == 1, primary_services
    primary_service = primary_services[0]
    service_grpc = [p["port"] for p in services[primary_service]["spec"]["ports"] if p["targetPort"] == "grpc"]
    assert len(service_grpc) == 1, f"Service {primary_service} exposes no gRPC port"
    replicas = {n: argv for n, argv in argvs.items() if n != primary}

    def jwt_key(container: dict[str, Any]) -> Any:
        return next((e["valueFrom"] for e in container.get("env", []) if e["name"] == "SQLD_AUTH_JWT_KEY"), None)

    assert jwt_key(primary_container), "the primary checks tokens (SQLD_AUTH_JWT_KEY)"
    for name, argv in replicas.items():
        url = flag(argv, "--primary-grpc-url")
        assert url and url.startswith("http://"), (name, url)
        assert url_service(url, services) == (primary_service, service_grpc[0]), f"{name}: {url} is not the primary's gRPC port"
        assert flag(argv, "--grpc-listen-addr") is None, f"{name}: a replica has no gRPC listener of its own"
        assert jwt_key(containers(sqlds[name])[0]) == jwt_key(primary_container), f"{name}: not the primary's JWT key"
        labels = pod_labels(sqlds[name])
        assert labels.get("site"), f"replica {name}: no site label"
        liveness = containers(sqlds[name])[0]["livenessProbe"]
        assert liveness.get("httpGet", {}).get("path") == "/health", f"{name}: a replica's liveness is /health: it must not write"

    # The gRPC port: admitted from the replicas only (sqld does not authenticate it).
    if replicas:
        guarding = [
            p for p in policies.values()
            if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(sqlds[primary]).items()
        ]
        assert len(guarding) == 1, f"{len(guarding)} NetworkPolicies select the primary"
        rules = guarding[0]["spec"]["ingress"]
        grpc_rules = [r for r in rules if any(p["port"] in ("grpc", grpc_port) for p in r.get("ports", []))]
        assert grpc_rules and all(r.get("from") for r in grpc_rules), "the gRPC port is open to all"
        for rule in grpc_rules:
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer
        for name in replicas:
            assert any(
                peer["podSelector"]["matchLabels"].items() <= pod_labels(sqlds[name]).items()
                for rule in grpc_rules for peer in rule["from"]
            ), f"replica {name} may not reach the primary's gRPC port"
        assert any(r.get("from") is None and any(p["port"] == "http" for p in r["ports"]) for r in rules), "the HTTP port is closed"

    with open(os.path.join(root, "spin.toml"), "rb") as f:
        manifest = tomllib.load(f)
    required = {name for name, v in manifest["variables"].items() if v.get("required")}
    routes = {t["route"]: t.get("component") for t in manifest["trigger"]["http"]}
    with open(os.path.join(root, "functions", "meta", "src", "lib.rs")) as f:
        meta = f.read()
    body = meta.split("fn openapi(", 1)[1].split("\n}\n", 1)[0]
    assert "Spin" not in body and "store" not in body.lower(), "the liveness route must touch no store"

    audit_keys = set()
    on_primary = []
    site_apps: dict[str, str] = {}
    for app_name, app in spinapps.items():
        spec = app["spec"]
        site = app["metadata"].get("labels", {}).get("site")

        # The runtime config: libSQL and Redis at the Services' addresses; the database is
        # the primary for the app without a site, the site's replica for a site's app, and
        # Redis is the site's (or, without a site, one of no site).
        config = tomllib.loads(secret_value(secrets, spec["runtimeConfig"]["loadFromSecret"], "runtime-config.toml"))
        database = config["sqlite_database"]["default"]
        key_value = config["key_value_store"]["default"]
        assert database["type"] == "libsql" and "token" in database, database
        assert key_value["type"] == "redis", key_value
        db_service, db_port = url_service(database["url"], services)
        kv_service, kv_port = url_service(key_value["url"], services)
        assert db_port == 8080 and selected[db_service] in sqlds, f"{app_name}: {database['url']} is not a sqld"
        assert kv_port == 6379 and containers(workloads[selected[kv_service]])[0]["image"].startswith("redis:"), key_value
        if site is None:
            assert selected[db_service] == primary, f"{app_name} (no site) is not on the primary"
            on_primary.append(app_name)
        else:
            replica = selected[db_service]
            assert replica in replicas and pod_labels(sqlds[replica]).get("site") == site, (
                f"{app_name} (site {site}): {database['url']} is not the site's replica"
            )
            assert site not in site_apps, f"two apps at site {site}"
            site_apps[site] = app_name
        assert pod_labels(workloads[selected[kv_service]]).get("site") == site, f"{app_name}: {key_value['url']} is not at site {site}"

        # The app's variables: every required one of spin.toml is bound, from a Secret that has it.
        bound = {v["name"] for v in spec.get("variables", [])}
        assert required <= bound, f"{app_name}: required variables not bound: {required - bound}"
        assert bound <= set(manifest["variables"]), f"{app_name}: unknown variables: {bound - set(manifest['variables'])}"
        for variable in spec["variables"]:
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                secret_value(secrets, ref["name"], ref["key"])
            if variable["name"] == "audit_key":
                audit_keys.add(json.dumps(variable, sort_keys=True))

        # Probes: readiness is the health check; liveness a public route that touches no store.
        assert spec["checks"]["readiness"]["httpGet"]["path"] == "/v1/healthz", app_name
        liveness = spec["checks"]["liveness"]["httpGet"]["path"]
        assert liveness == "/v1/openapi.json" and liveness in routes, liveness

        # Autoscaling: the operator leaves replicas to an HPA aimed at the app's Deployment.
        assert spec.get("enableAutoscaling") is True and "replicas" not in spec, spec
        targets = [h for h in hpas.values() if h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": app_name}]
        assert len(targets) == 1, f"no HorizontalPodAutoscaler for Deployment {app_name}"
        hpa = targets[0]["spec"]
        assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"], hpa
        if any(m["type"] == "Resource" for m in hpa["metrics"]):
            assert "cpu" in spec["resources"]["requests"], "CPU utilisation needs a CPU request"

    # One app migrates the schema: the one on the primary. Every replica serves a site's app.
    assert len(on_primary) == 1, f"one SpinApp on the primary (it migrates the schema), not {on_primary}"
    served = {pod_labels(sqlds[r])["site"] for r in replicas}
    assert served == set(site_apps), f"replicas at {sorted(served)}, apps at {sorted(site_apps)}"
    assert len(audit_keys) == 1, "every app's audit_key comes from the same Secret key"
    print(f"  primary sqld {primary} (gRPC on Service {primary_service}:{service_grpc[0]}), app {on_primary[0]}")
    for site, app_name in sorted(site_apps.items()):
        print(f"  site {site}: app {app_name} on replica {[r for r in replicas if pod_labels(sqlds[r])['site'] == site][0]}")

    # The primary sqld: checkpoints on a timer, and a liveness probe that writes.
    assert "--checkpoint-interval-s" in primary_container["args"], primary_container["args"]
    assert "--max-log-size" in primary_container["args"], primary_container["args"]
    command = primary_container["livenessProbe"]["exec"]["command"]
    assert command[0] == "timeout" and "INSERT" in command[-1], command
    for name, workload in workloads.items():
        container = containers(workload)[0]
        if container["image"].startswith("redis:"):
            assert container["livenessProbe"] and container["readinessProbe"], name


def applied_after(base: list[tuple[str, dict[str, Any]]], later: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The objects `kubectl apply` leaves of `base` then `later`: a later object replaces one
    of the same kind and name."""
    replaced = {(o["kind"], o["metadata"]["name"]) for _, o in later}
    return [(p, o) for p, o in base if (o["kind"], o["metadata"]["name"]) not in replaced] + later


def check_cells(root: str, base: list[tuple[str, dict[str, Any]]], cells: list[tuple[str, dict[str, Any]]]) -> None:
    """deploy/cells/ applied after the rest: each label the cells' manifest grants is in the
    runtime config, the directory's on the primary of deploy/sqld.yaml and each other cell's
    on a pod of its own of a headless Service's StatefulSet, each of those a primary with the
    primary's flags, liveness probe and JWT key; one token and one Redis for all."""
    objects = applied_after(base, cells)
    secrets = by_kind(objects, "Secret")
    services = by_kind(objects, "Service")
    workloads = by_kind(objects, "StatefulSet")
    (app_name, app), = [(n, a) for n, a in by_kind(objects, "SpinApp").items() if "site" not in a["metadata"].get("labels", {})]
    config = tomllib.loads(secret_value(secrets, app["spec"]["runtimeConfig"]["loadFromSecret"], "runtime-config.toml"))
    databases = config["sqlite_database"]
    count = len(databases)
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "spin.toml")
        subprocess.run([sys.executable, os.path.join(root, "scripts", "cells-manifest"), str(count), out], check=True)
        with open(out, "rb") as f:
            manifest = tomllib.load(f)
    granted = {label for c in manifest["component"].values() for label in c.get("sqlite_databases", [])}
    assert granted == set(databases), f"the runtime config's labels {sorted(databases)} are not the manifest's {sorted(granted)}"
    assert manifest["variables"]["cells"]["default"] == str(count), manifest["variables"]["cells"]
    assert len({d["token"] for d in databases.values()}) == 1, "one token opens every cell"

    primary = workloads["sqld"]
    primary_container = containers(primary)[0]
    assert url_service(databases["default"]["url"], services) == ("sqld", 8080), databases["default"]["url"]
    pods = set()
    for label, database in databases.items():
        if label == "default":
            continue
        host = database["url"].split("://", 1)[1].rsplit(":", 1)[0]
        pod, service_name, rest = host.split(".", 2)
        assert rest == f"{NAMESPACE}.svc.cluster.local", host
        service = services[service_name]
        assert service["spec"].get("clusterIP") == "None", f"{service_name}: not headless, so it would balance over the cells"
        (workload_name,) = [n for n, w in workloads.items() if service["spec"]["selector"].items() <= pod_labels(w).items()]
        workload = workloads[workload_name]
        assert workload["spec"]["serviceName"] == service_name, workload_name
        index = int(pod.removeprefix(f"{workload_name}-"))
        assert 0 <= index < workload["spec"]["replicas"], f"{label}: {pod} is not a pod of {workload_name}"
        pods.add(pod)
        container = containers(workload)[0]
        argv = sqld_argv(container)
        assert flag(argv, "--grpc-listen-addr") and not flag(argv, "--primary-grpc-url"), f"{label}: not a primary"
        for name in ("--checkpoint-interval-s", "--max-log-size"):
            assert flag(argv, name) == flag(sqld_argv(primary_container), name), (label, name)
        assert container["livenessProbe"] == primary_container["livenessProbe"], f"{label}: not the primary's liveness probe"
        env = {e["name"]: e.get("valueFrom") for e in container["env"]}
        primary_env = {e["name"]: e.get("valueFrom") for e in primary_container["env"]}
        assert env["SQLD_AUTH_JWT_KEY"] == primary_env["SQLD_AUTH_JWT_KEY"], f"{label}: not the primary's JWT key"
        assert container["volumeMounts"][0]["name"] in {t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]}, label
    assert len(pods) == count - 1, f"two cells on one pod: {sorted(pods)}"
    print(f"  {count} cells for app {app_name}: default on sqld, " + ", ".join(sorted(pods)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_sqld_probe(objects: list[tuple[str, dict[str, Any]]], sqld_binary: str) -> None:
    container = by_kind(objects, "StatefulSet")["sqld"]["spec"]["template"]["spec"]["containers"][0]
    command = list(container["livenessProbe"]["exec"]["command"])
    port = free_port()
    assert "/dev/tcp/127.0.0.1/8080" in command[-1], command[-1]
    command[-1] = command[-1].replace("/dev/tcp/127.0.0.1/8080", f"/dev/tcp/127.0.0.1/{port}")
    deadline_s = int(command[1])
    env = dict(os.environ, SQLD_PROBE_TOKEN="")

    def probe(limit: int | None = None) -> tuple[int, float, str]:
        argv = list(command)
        if limit is not None:
            argv[1] = str(limit)
        started = time.monotonic()
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        return result.returncode, time.monotonic() - started, result.stdout + result.stderr

    with tempfile.TemporaryDirectory(prefix="sqld-probe.") as data:
        log_path = os.path.join(data, "sqld.log")
        log = open(log_path, "wb")
        server = subprocess.Popen(
            [sqld_binary, "--db-path", os.path.join(data, "db"), "--http-listen-addr", f"127.0.0.1:{port}",
             "--no-welcome", "--disable-metrics", "--checkpoint-interval-s", "5"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(port, server, log_path)
            code, took, output = probe()
            assert code == 0, f"the probe failed against a healthy sqld: {output}"
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/",
                data=json.dumps({"statements": ["SELECT at FROM _sqld_liveness WHERE id = 1"]}).encode(),
                headers={"Content-Type": "application/json"},
            )
            rows = json.load(urllib.request.urlopen(request, timeout=5))[0]["results"]["rows"]
            assert rows and abs(rows[0][0] - time.time()) < 60, rows
            print(f"  healthy sqld: the probe wrote its row and passed in {took:.2f} s")
            # A stalled sqld: connections are accepted by the kernel, nothing answers. The
            # probe's own deadline ends it (shortened here from the manifest's {deadline_s} s).
            server.send_signal(signal.SIGSTOP)
            code, took, output = probe(limit=2)
            server.send_signal(signal.SIGCONT)
            assert code != 0 and took < 10, f"the probe passed against a stopped sqld: {code} {output}"
            print(f"  stalled sqld (SIGSTOP): the probe failed after {took:.2f} s (exit {code})")
        finally:
            server.kill()
            server.wait()
        code, took, output = probe()
        assert code != 0, f"the probe passed with no sqld: {output}"
        print(f"  no sqld: the probe failed after {took:.2f} s (exit {code})")


def fresh_jwt(directory: str) -> tuple[str, str]:
    """A new Ed25519 key pair (openssl): the public key in PEM, as the Secret sqld-auth holds
    it, and a full-access libSQL token signed with the private key."""
    key = os.path.join(directory, "jwt-key.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True, capture_output=True)
    public = subprocess.run(["openssl", "pkey", "-in", key, "-pubout"], check=True, capture_output=True, text=True).stdout

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = b64(json.dumps({"alg": "EdDSA", "typ": "JWT"}).encode()) + "." + b64(json.dumps({"a": "rw"}).encode())
    signing_file = os.path.join(directory, "jwt-input")
    with open(signing_file, "w") as f:
        f.write(signing_input)
    signature = subprocess.run(
        ["openssl", "pkeyutl", "-sign", "-inkey", key, "-rawin", "-in", signing_file], check=True, capture_output=True
    ).stdout
    return public, signing_input + "." + b64(signature)


def sql(port: int, statements: list[str], token: str | None) -> tuple[int, Any]:
    """Runs statements through sqld's HTTP API: the status and the decoded answer."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/", data=json.dumps({"statements": statements}).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_healthy(port: int, server: subprocess.Popen[bytes], log: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                with open(log) as f:
                    raise AssertionError(f"sqld did not start: {f.read()[-2000:]}")
            time.sleep(0.1)


def check_sites_topology(objects: list[tuple[str, dict[str, Any]]], sqld_binary: str) -> None:
    workloads = {**by_kind(objects, "Deployment"), **by_kind(objects, "StatefulSet")}
    sqlds = {n: containers(w)[0] for n, w in workloads.items() if containers(w)[0]["image"].startswith(SQLD_IMAGE)}
    argvs = {n: sqld_argv(c) for n, c in sqlds.items()}
    (primary,) = [n for n, argv in argvs.items() if flag(argv, "--grpc-listen-addr")]
    replicas = sorted(n for n in argvs if n != primary)
    assert replicas, "no read replica"
    replica = replicas[0]

    usage = subprocess.run([sqld_binary, "--help"], capture_output=True, text=True, check=True).stdout
    known = set(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z0-9-]+)", usage))
    for name, argv in argvs.items():
        unknown = [a for a in argv if a.startswith("--") and a not in known]
        assert not unknown, f"{name}: flags sqld --help does not list: {unknown}"
    print(f"  every flag of {', '.join(sorted(argvs))} is one sqld --help lists")

    with tempfile.TemporaryDirectory(prefix="sqld-sites.") as data:
        public_key, token = fresh_jwt(data)
        secret_values = {("sqld-auth", "jwt-public-key"): public_key, ("sqld-auth", "probe-token"): token}
        ports = {"http": {}, "grpc": {}}
        servers: list[subprocess.Popen[bytes]] = []

        def start(name: str) -> int:
            """Starts sqld as its manifest does, on loopback; its HTTP port."""
            argv = list(argvs[name])
            argv[0] = sqld_binary
            ports["http"][name] = free_port()
            replace = {
                "--db-path": os.path.join(data, name),
                "--http-listen-addr": f"127.0.0.1:{ports['http'][name]}",
            }
            if flag(argv, "--grpc-listen-addr"):
                ports["grpc"][name] = free_port()
                replace["--grpc-listen-addr"] = f"127.0.0.1:{ports['grpc'][name]}"
            if flag(argv, "--primary-grpc-url"):
                # check_wiring checked that the URL is the primary's gRPC Service port.
                replace["--primary-grpc-url"] = f"http://127.0.0.1:{ports['grpc'][primary]}"
            for key, value in replace.items():
                argv[argv.index(key) + 1] = value
            env = dict(os.environ)
            for variable in sqlds[name].get("env", []):
                if "value" in variable:
                    env[variable["name"]] = variable["value"]
                else:
                    ref = variable["valueFrom"]["secretKeyRef"]
                    env[variable["name"]] = secret_values[(ref["name"], ref["key"])]
            log = os.path.join(data, f"{name}.log")
            server = subprocess.Popen(argv, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
            servers.append(server)
            wait_healthy(ports["http"][name], server, log)
            return ports["http"][name]

        try:
            primary_port = start(primary)
            replica_port = start(replica)
            print(f"  {primary} and {replica} started with their manifests' command lines and env")

            status, answer = sql(replica_port, ["CREATE TABLE site_check (x INTEGER)"], None)
            assert status == 401, f"the replica took a write without a token: {status} {answer}"
            status, answer = sql(replica_port, ["CREATE TABLE site_check (x INTEGER)", "INSERT INTO site_check VALUES (1)"], token)
            assert status == 200 and "error" not in json.dumps(answer), f"the replica refused a write with a token: {status} {answer}"
            status, answer = sql(primary_port, ["SELECT x FROM site_check"], token)
            assert status == 200 and answer[0]["results"]["rows"] == [[1]], f"the write did not reach the primary: {status} {answer}"
            deadline = time.monotonic() + 10
            while True:
                status, answer = sql(replica_port, ["SELECT x FROM site_check"], token)
                if status == 200 and "error" not in json.dumps(answer) and answer[0]["results"]["rows"] == [[1]]:
                    break
                assert time.monotonic() < deadline, f"the replica did not receive the write: {status} {answer}"
                time.sleep(0.05)
            print(f"  {replica}: refused a write without a token (401); forwarded one with a token to {primary}, then served it from its copy")

            command = list(sqlds[primary]["livenessProbe"]["exec"]["command"])
            command[-1] = command[-1].replace("/dev/tcp/127.0.0.1/8080", f"/dev/tcp/127.0.0.1/{primary_port}")
            for probe_token, should_pass in [(token, True), ("", False)]:
                result = subprocess.run(command, env=dict(os.environ, SQLD_PROBE_TOKEN=probe_token), capture_output=True, text=True, timeout=60)
                assert (result.returncode == 0) == should_pass, f"token {bool(probe_token)}: {result.stdout}{result.stderr}"
            print(f"  {primary}'s liveness probe: passed with the probe token, failed without it")
        finally:
            for server in servers:
                server.kill()
                server.wait()


def main(root: str, sqld_binary: str) -> int:
    objects = load(root)
    cells = load(root, os.path.join("deploy", "cells"))
    passed, failed = 0, 0
    checks: list[tuple[str, Callable[[], None]]] = [
        ("every manifest validates against its schema", lambda: check_schemas(root, objects + cells)),
        ("the market in cells (deploy/cells/) fits the rest and the cells' manifest", lambda: check_cells(root, objects, cells)),
        ("the manifests fit together and fit the app", lambda: check_wiring(root, objects)),
        ("sqld's liveness probe against a real sqld", lambda: check_sqld_probe(objects, sqld_binary)),
        ("the primary and a site's replica, run as their manifests say", lambda: check_sites_topology(objects, sqld_binary)),
    ]
    for name, check in checks:
        try:
            check()
        except Exception:  # noqa: BLE001 - every failure is reported, then the run goes on
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        else:
            passed += 1
            print(f"ok   {name}", flush=True)
    print(f"deploy: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
