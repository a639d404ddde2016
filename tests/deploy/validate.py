"""The Kubernetes manifests in deploy/, checked without a cluster.

1. Every object validates against its schema: the built-in kinds against Kubernetes' own
   OpenAPI schemas as the kubernetes-validate package ships them (strict: an unknown field
   fails), for the oldest and the newest Kubernetes it is checked against; SpinApp against
   deploy/schemas/spinapp-v1alpha1.json. A kind with no schema fails.
2. The objects fit together and fit the app: every Service selects pods of a workload and
   names ports they have; every Secret key that is referenced exists; the runtime config in
   its Secret is TOML that puts the database on libSQL and the key-value store on Redis at
   the Services' addresses; the SpinApp binds every required variable of spin.toml, probes
   readiness on /v1/healthz and liveness on a public route that touches no store, and is
   autoscaled by a HorizontalPodAutoscaler aimed at its Deployment; sqld runs with
   --checkpoint-interval-s and a liveness probe that writes.
3. sqld's liveness probe, the script itself, run against a real sqld (the one scripts/stores
   installs): it passes while sqld serves writes and has written its row, and fails when
   sqld does not answer in time (stopped with SIGSTOP) and when nothing listens.

    python validate.py REPO_ROOT SQLD_BINARY
Prints 'N passed, N failed' last.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import urllib.request
from typing import Any, Callable

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

VERSIONS = ["1.30.0", all_versions()[-1]]
KINDS_IN_REPO = {("core.spinkube.dev/v1alpha1", "SpinApp"): "deploy/schemas/spinapp-v1alpha1.json"}


def load(root: str) -> list[tuple[str, dict[str, Any]]]:
    objects = []
    for path in sorted(glob.glob(os.path.join(root, "deploy", "*.yaml"))):
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


def check_wiring(root: str, objects: list[tuple[str, dict[str, Any]]]) -> None:
    secrets = by_kind(objects, "Secret")
    services = by_kind(objects, "Service")
    workloads = {**by_kind(objects, "Deployment"), **by_kind(objects, "StatefulSet")}
    spinapps = by_kind(objects, "SpinApp")
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    assert len(spinapps) == 1, spinapps.keys()
    (app_name, app), = spinapps.items()
    spec = app["spec"]

    # Services select a workload's pods and name its ports.
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matching = [
            w for w in workloads.values() if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, f"Service {name} selects {len(matching)} workloads"
        ports = {p["name"] for c in matching[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: no container port {port['targetPort']}"
    for name, workload in workloads.items():
        assert workload["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"].items(), name
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret_value(secrets, ref["name"], ref["key"])

    # The runtime config: libSQL and Redis at the Services' addresses.
    config = tomllib.loads(secret_value(secrets, spec["runtimeConfig"]["loadFromSecret"], "runtime-config.toml"))
    database = config["sqlite_database"]["default"]
    key_value = config["key_value_store"]["default"]
    assert database["type"] == "libsql" and "token" in database, database
    assert key_value["type"] == "redis", key_value
    for url, service, port in [(database["url"], "sqld", 8080), (key_value["url"], "redis", 6379)]:
        host = url.split("://", 1)[1].split("/", 1)[0]
        assert host.split(".")[0] == service and host.endswith(f":{port}"), f"{url} is not the {service} Service"
        assert any(p["port"] == port for p in services[service]["spec"]["ports"]), (service, port)

    # The app's variables: every required one of spin.toml is bound, from a Secret that has it.
    with open(os.path.join(root, "spin.toml"), "rb") as f:
        manifest = tomllib.load(f)
    required = {name for name, v in manifest["variables"].items() if v.get("required")}
    bound = {v["name"] for v in spec.get("variables", [])}
    assert required <= bound, f"required variables not bound: {required - bound}"
    assert bound <= set(manifest["variables"]), f"unknown variables: {bound - set(manifest['variables'])}"
    for variable in spec["variables"]:
        ref = variable.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret_value(secrets, ref["name"], ref["key"])

    # Probes: readiness is the health check; liveness a public route that touches no store.
    routes = {t["route"]: t.get("component") for t in manifest["trigger"]["http"]}
    assert spec["checks"]["readiness"]["httpGet"]["path"] == "/v1/healthz"
    liveness = spec["checks"]["liveness"]["httpGet"]["path"]
    assert liveness == "/v1/openapi.json" and liveness in routes, liveness
    with open(os.path.join(root, "functions", "meta", "src", "lib.rs")) as f:
        meta = f.read()
    body = meta.split("fn openapi(", 1)[1].split("\n}\n", 1)[0]
    assert "Spin" not in body and "store" not in body.lower(), "the liveness route must touch no store"

    # Autoscaling: the operator leaves replicas to an HPA aimed at the app's Deployment.
    assert spec.get("enableAutoscaling") is True and "replicas" not in spec, spec
    targets = [h for h in hpas.values() if h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": app_name}]
    assert len(targets) == 1, f"no HorizontalPodAutoscaler for Deployment {app_name}"
    hpa = targets[0]["spec"]
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"], hpa
    if any(m["type"] == "Resource" for m in hpa["metrics"]):
        assert "cpu" in spec["resources"]["requests"], "CPU utilisation needs a CPU request"

    # sqld: checkpoints on a timer, and a liveness probe that writes.
    sqld = workloads["sqld"]["spec"]["template"]["spec"]["containers"][0]
    assert "--checkpoint-interval-s" in sqld["args"], sqld["args"]
    command = sqld["livenessProbe"]["exec"]["command"]
    assert command[0] == "timeout" and "INSERT" in command[-1], command
    redis = workloads["redis"]["spec"]["template"]["spec"]["containers"][0]
    assert redis["livenessProbe"] and redis["readinessProbe"], redis


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
        log = open(os.path.join(data, "sqld.log"), "wb")
        server = subprocess.Popen(
            [sqld_binary, "--db-path", os.path.join(data, "db"), "--http-listen-addr", f"127.0.0.1:{port}",
             "--no-welcome", "--disable-metrics", "--checkpoint-interval-s", "5"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "sqld did not start"
                    time.sleep(0.1)
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


def main(root: str, sqld_binary: str) -> int:
    objects = load(root)
    passed, failed = 0, 0
    checks: list[tuple[str, Callable[[], None]]] = [
        ("every manifest validates against its schema", lambda: check_schemas(root, objects)),
        ("the manifests fit together and fit the app", lambda: check_wiring(root, objects)),
        ("sqld's liveness probe against a real sqld", lambda: check_sqld_probe(objects, sqld_binary)),
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
