#!/usr/bin/env python3
"""The capacity console in a real browser (Debian's Chromium, driven by chromedriver).

Starts the app with the project's host on a free port and fresh state, builds a world through
the API (orgs, one with markup in its name, keys, two nodes, an active reservation with
released units, a pending one, one under review, and spot, community and verified VMs), then
drives /console as a person would and checks it against the API:

- the headers of the page, every asset and a 404 (CSP same-origin only, nosniff, no-referrer);
- the key is kept in sessionStorage, never in the URL;
- every unit's rendered state and label is what the API's data says, every state has a
  colour and a pattern of its own and a text label, and the legend shows them all;
- markup in an org's name and in reasons is shown as text, never parsed;
- the audit trail of a reservation is shown as the API lists it;
- a dry run from the page marks on the map exactly the VMs the API says it would terminate
  and skip, and changes nothing; cancel, then confirm runs the reclaim and the API changed;
- a release done with the keyboard alone changes the API's state; a refused release shows the
  problem's title, detail and offending unit ids and changes nothing;
- a key without rights sees emptiness and no action buttons;
- readable at 1280x800 and at 390x844 (no horizontal scrolling), with screenshots of both;
- no CSP violation or script error in the browser's log, a check that first proves it can see
  both: a script error and an inline script, made on purpose in the page, are caught.

First, before any of that, it takes the picture the README shows (console.png: a realistic
node during a reclaim's dry run, built from its own fixture), so that the test's markup
payloads and ids never appear in it. `scripts/console-test --update-docs` copies it to
docs/console.png.

Usage: console_test.py --host BIN --manifest spin.toml --screenshots DIR
Prints 'N passed, N failed' last; exits non-zero when a check failed.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

# What the console must show for each state (functions/console/static/js/occupancy.js).
STATE_LABELS = {
    "free": "free",
    "reserved": "reserved",
    "released": "spot market",
    "running": None,  # "<tier> VM"
    "needs-review": "review",
}
EVIL_ORG_NAME = '<img src=x id="pwned-org"><b id="pwned-b">Owner & Co</b> "quoted"'
EVIL_REASON = '<script id="pwned-script">window.pwned = 1</script><i id="pwned-i">quarterly</i>'
EVIL_CONTRACT = "<a id=\"pwned-a\" href=\"javascript:alert(1)\">c-42</a>"
RELEASE_REASON = "<b id=\"pwned-release\">spot</b> sale & more"


# ---------------------------------------------------------------------- the app and its API


class Api:
    def __init__(self, base, token):
        self.base = base
        self.token = token

    def send(self, method, path, body=None, token=None):
        token = token if token is not None else self.token
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def json(self, method, path, body=None, token=None, expect=200):
        status, _, raw = self.send(method, path, body, token)
        if status != expect:
            raise AssertionError(f"{method} {path}: {status}, want {expect}: {raw[:500]!r}")
        return json.loads(raw) if raw else None

    def all(self, path, token=None):
        items, cursor = [], None
        while True:
            sep = "&" if "?" in path else "?"
            page = self.json("GET", f"{path}{sep}limit=100" + (f"&cursor={cursor}" if cursor else ""), token=token)
            items += page["items"]
            cursor = page.get("nextCursor")
            if not cursor:
                return items


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_host(binary, manifest, state):
    port = free_port()
    token = "console-test-op-" + secrets.token_hex(16)
    env = dict(os.environ)
    env["SPIN_VARIABLE_OPERATOR_TOKEN"] = token
    env["SPIN_VARIABLE_AUDIT_KEY"] = secrets.token_hex(32)
    log = open(os.path.join(state, "host.log"), "wb")
    process = subprocess.Popen(
        [binary, "--manifest", manifest, "--listen", f"127.0.0.1:{port}", "--state-dir", state, "--quiet"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    api = Api(f"http://127.0.0.1:{port}", token)
    deadline = time.time() + 180
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the host exited: {open(os.path.join(state, 'host.log')).read()}")
        try:
            if api.send("GET", "/v1/healthz")[0] == 200:
                return process, api
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the host did not answer within 180 s")


def iso(delta):
    return (datetime.now(timezone.utc) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_scene(api):
    """The picture for the README (docs/console.png): a node as its owner's capacity manager
    sees it in the middle of a reclaim's dry run, with names a user would recognise. Built
    before the test's own world, so that nothing of the tests (markup in names, test ids) is
    on the page."""
    s = {}
    for org, name in [
        ("northwind", "Northwind GPU Cloud"),
        ("helix", "Helix Bio Research"),
        ("tensorbrokers", "Tensor Brokers"),
        ("quanta", "Quanta Labs"),
        ("openfold", "OpenFold Institute"),
    ]:
        api.json("POST", "/v1/orgs", {"id": org, "name": name}, expect=201)

    def key(org, name, role):
        return api.json("POST", f"/v1/orgs/{org}/keys", {"name": name, "role": role}, expect=201)["token"]

    s["owner"] = key("northwind", "capacity desk", "capacity-manager")
    broker = key("tensorbrokers", "market desk", "capacity-manager")
    helix = key("helix", "training jobs", "member")
    quanta = key("quanta", "batch jobs", "member")
    openfold = key("openfold", "inference", "member")

    s["node"] = "fra1-h100-07"
    units = [f"gpu{n:02d}" for n in range(16)]
    api.json("PUT", f"/v1/nodes/{s['node']}", {"ownerOrgId": "northwind", "unitIds": units}, expect=201)
    api.json("PUT", "/v1/nodes/fra1-h100-08", {"ownerOrgId": "northwind", "unitIds": [f"gpu{n:02d}" for n in range(8)]}, expect=201)
    api.json("PUT", "/v1/nodes/ams2-a100-03", {"ownerOrgId": "northwind", "unitIds": [f"gpu{n:02d}" for n in range(8)]}, expect=201)
    reservation = api.json(
        "POST",
        f"/v1/nodes/{s['node']}/reservations",
        {
            "reservedUnitIds": units[:10],
            "allowedOrgIds": ["helix"],
            "managingOrgIds": ["tensorbrokers"],
            "startsAt": iso(timedelta(days=-3)),
            "endsAt": iso(timedelta(days=88)),
            "contractRef": "MSA-2025-114",
            "reason": "Protein-folding training, third quarter",
        },
        expect=201,
    )
    s["reservation"] = reservation["id"]
    api.json(
        "POST",
        f"/v1/nodes/{s['node']}/reservations/{s['reservation']}/release",
        {"unitIds": units[:5], "reason": "idle until the next training run"},
        token=broker,
    )
    api.json(
        "POST",
        f"/v1/nodes/{s['node']}/reservations",
        {"reservedUnitIds": units[10:12], "allowedOrgIds": ["openfold"], "startsAt": iso(timedelta(days=2)), "contractRef": "PO-7731"},
        expect=201,
    )

    def place(token, on, tier):
        return api.json("POST", "/v1/vms", {"nodeId": s["node"], "unitIds": on, "tier": tier}, token=token, expect=201)["id"]

    place(quanta, ["gpu00"], "spot")
    place(openfold, ["gpu01", "gpu02"], "spot")
    place(helix, ["gpu06"], "verified")
    place(helix, ["gpu07"], "community")
    s["select"] = ["gpu00", "gpu01", "gpu06"]
    return s


def take_picture(driver, api, scene, path):
    """The owner's capacity manager selects three units and asks what reclaiming them would do."""
    driver.get(api.base + "/console")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#legend .legend-item"), "the page's modules to run")
    connect(driver, scene["owner"], press_enter=False)
    open_node(driver, scene["node"], 16)
    for unit in scene["select"]:
        click_unit(driver, unit)
    wait(driver, lambda d: d.find_element(By.ID, "reclaim").is_displayed(), "the Reclaim button")
    driver.find_element(By.ID, "reason").send_keys("training run starts")
    driver.find_element(By.ID, "reclaim").click()
    wait(driver, lambda d: d.find_element(By.ID, "plan").is_displayed(), "the dry run's plan")
    marks = {u: c["plan"] for u, c in cells(driver).items() if c["plan"]}
    assert marks == {"gpu00": "terminate", "gpu01": "terminate", "gpu02": "terminate", "gpu06": "skip"}, marks
    screenshot(driver, path)
    driver.find_element(By.ID, "cancel-reclaim").click()
    driver.find_element(By.ID, "forget").click()
    wait(driver, lambda d: "Paste an API key" in d.find_element(By.ID, "identity").text, "the key to be forgotten")


def build_world(api):
    """Orgs, keys, two nodes, reservations in every status that holds units, and VMs."""
    w = {}
    api.json("POST", "/v1/orgs", {"id": "owner", "name": EVIL_ORG_NAME}, expect=201)
    for org in ["aud", "stranger"]:
        api.json("POST", "/v1/orgs", {"id": org, "name": f"Org {org}"}, expect=201)

    def key(org, role, permissions=None):
        body = {"name": f"{role} <key>", "role": role}
        if permissions:
            body["permissions"] = permissions
        return api.json("POST", f"/v1/orgs/{org}/keys", body, expect=201)["token"]

    w["capacity"] = key("owner", "capacity-manager")
    w["aud"] = key("aud", "member")
    w["stranger"] = key("stranger", "admin")
    w["narrow"] = key("owner", "viewer", ["vm.read"])

    w["node"] = "gpu-node-1"
    w["units"] = [f"g{n:02d}" for n in range(16)]
    api.json("PUT", f"/v1/nodes/{w['node']}", {"ownerOrgId": "owner", "unitIds": w["units"]}, expect=201)
    reservation = api.json(
        "POST",
        f"/v1/nodes/{w['node']}/reservations",
        {
            "reservedUnitIds": w["units"][:10],
            "allowedOrgIds": ["aud"],
            "startsAt": iso(timedelta(minutes=-5)),
            "endsAt": iso(timedelta(days=30)),
            "contractRef": EVIL_CONTRACT,
            "reason": EVIL_REASON,
        },
        expect=201,
    )
    w["reservation"] = reservation["id"]
    api.json(
        "POST",
        f"/v1/nodes/{w['node']}/reservations/{w['reservation']}/release",
        {"unitIds": w["units"][:5], "reason": RELEASE_REASON},
    )
    # A term that starts tomorrow: its units are reserved (spot only until then).
    api.json(
        "POST",
        f"/v1/nodes/{w['node']}/reservations",
        {"reservedUnitIds": ["g10", "g11"], "allowedOrgIds": ["aud"], "startsAt": iso(timedelta(days=1))},
        expect=201,
    )

    def place(token, units, tier, node=None):
        vm = api.json("POST", "/v1/vms", {"nodeId": node or w["node"], "unitIds": units, "tier": tier}, token=token, expect=201)
        return vm["id"]  # server-generated ids: always taken from the answer

    w["vm_spot_aud"] = place(w["aud"], ["g00"], "spot")  # on released capacity
    w["vm_spot_stranger"] = place(w["stranger"], ["g01", "g02"], "spot")  # on released capacity
    w["vm_verified"] = place(w["aud"], ["g06"], "verified")  # reserved, the audience
    w["vm_community"] = place(w["stranger"], ["g13"], "community")  # a free unit

    # A node whose unit set changed under its reservation: needs-review.
    w["node2"] = "gpu-node-2"
    api.json("PUT", f"/v1/nodes/{w['node2']}", {"ownerOrgId": "owner", "unitIds": ["h0", "h1", "h2"]}, expect=201)
    review = api.json(
        "POST",
        f"/v1/nodes/{w['node2']}/reservations",
        {"reservedUnitIds": ["h0", "h1"], "allowedOrgIds": ["aud"], "startsAt": iso(timedelta(minutes=-5))},
        expect=201,
    )
    api.json("PUT", f"/v1/nodes/{w['node2']}", {"ownerOrgId": "owner", "unitIds": ["h0", "h1", "h2", "h3"]})
    status = api.json("GET", f"/v1/nodes/{w['node2']}/reservations/{review['id']}")["status"]
    assert status == "needs-review", status
    return w


def expected_units(api, node, token):
    """What each unit of `node` is, from the API as `token` sees it (the placement rules of docs/design.md)."""
    units = api.json("GET", f"/v1/nodes/{node}", token=token)["unitIds"]
    status, _, raw = api.send("GET", f"/v1/nodes/{node}/reservations?limit=100", token=token)
    reservations = json.loads(raw)["items"] if status == 200 else []
    status, _, raw = api.send("GET", f"/v1/vms?nodeId={node}&status=running&limit=500", token=token)
    vms = json.loads(raw)["items"] if status == 200 else []
    expected = {}
    for unit in units:
        holders = [r for r in reservations if unit in r["reservedUnitIds"] and r["status"] in ("active", "pending", "needs-review")]
        vm = next((v for v in vms if unit in v["unitIds"]), None)
        review = any(r["status"] == "needs-review" for r in holders)
        released = any(r["status"] == "active" and unit in r["releasedUnitIds"] for r in holders)
        if review:
            state = "needs-review"
        elif vm:
            state = "running"
        elif released:
            state = "released"
        elif holders:
            state = "reserved"
        else:
            state = "free"
        label = f"{vm['tier']} VM" if state == "running" else STATE_LABELS[state]
        expected[unit] = (state, label.upper(), vm["tier"] if vm else None, released)
    return expected


# ---------------------------------------------------------------------- the browser


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1280,800",
        "--lang=en-US",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    viewport(driver, 1280, 800)
    return driver


def viewport(driver, width, height, mobile=False):
    """Gives the page a width x height viewport, whatever the window manager and the load.

    The size is set through DevTools (what a device emulation does), not by resizing the
    window: a resize is applied asynchronously, and Chromium keeps a window at least 500 px
    wide. The page then reports the size, which is waited for rather than slept on.
    """
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )
    wait(
        driver,
        lambda d: js(d, "return [window.innerWidth, window.innerHeight]") == [width, height],
        f"a {width}x{height} viewport (the page reports {js(driver, 'return [window.innerWidth, window.innerHeight]')})",
    )


def screenshot(driver, path, at=None):
    """The page from its top (or from element `at`), with no focus ring in the picture."""
    js(driver, "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
    if at:
        js(driver, "document.getElementById(arguments[0]).scrollIntoView()", at)
    # Two animation frames: the scroll and the blur are painted before the capture.
    driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]))")
    driver.save_screenshot(path)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def run(self, name, function, *args):
        started = time.time()
        try:
            function(*args)
        except Exception:  # noqa: BLE001 - every failure is reported, then the run goes on
            self.failed.append(name)
            print(f"FAIL {name} ({time.time() - started:.1f}s)\n{traceback.format_exc()}", flush=True)
            return False
        self.passed += 1
        print(f"ok   {name} ({time.time() - started:.1f}s)", flush=True)
        return True


def wait(driver, condition, what, timeout=20):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))
    except Exception as error:
        raise AssertionError(f"timed out waiting for {what}") from error


def js(driver, script, *args):
    return driver.execute_script(script, *args)


def cells(driver):
    """unit id -> (state, label, tier, released, plan, selected) as rendered."""
    return {
        c["id"]: c
        for c in js(
            driver,
            """return [...document.querySelectorAll('#grid [data-unit-id]')].map(c => ({
                 id: c.dataset.unitId, state: c.dataset.state || null,
                 label: (c.querySelector('.unit-label')?.innerText || '').trim(),
                 tier: c.dataset.tier || null, released: c.dataset.released === 'true',
                 plan: c.dataset.plan || null, selected: c.getAttribute('aria-selected') === 'true',
                 background: getComputedStyle(c).backgroundColor,
                 pattern: getComputedStyle(c).backgroundImage,
                 border: getComputedStyle(c).borderTopStyle }))""",
        )
    }


def connect(driver, key, press_enter=True):
    """Pastes `key` and submits it with Enter, or with the Connect button."""
    if driver.find_elements(By.ID, "forget") and driver.find_element(By.ID, "forget").is_displayed():
        driver.find_element(By.ID, "forget").click()
    field = driver.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(key)
    if press_enter:
        field.send_keys(Keys.ENTER)
    else:
        driver.find_element(By.ID, "connect").click()
    wait(driver, lambda d: "Checking" not in d.find_element(By.ID, "identity").text and "Paste" not in d.find_element(By.ID, "identity").text, "the key to be checked")


def open_node(driver, node, count):
    button = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'#node-list [data-node-id="{node}"]'), f"node {node} in the list")[0]
    button.click()
    wait(driver, lambda d: len(cells(d)) == count and d.find_element(By.ID, "grid").get_attribute("aria-busy") == "false", f"{count} units of {node}")


def click_unit(driver, unit):
    driver.find_element(By.CSS_SELECTOR, f'#grid [data-unit-id="{unit}"]').click()


def compare_map(driver, api, node, token):
    expected = expected_units(api, node, token)
    rendered = cells(driver)
    assert set(rendered) == set(expected), f"units: {sorted(rendered)} vs {sorted(expected)}"
    wrong = []
    for unit, (state, label, tier, released) in expected.items():
        got = rendered[unit]
        if (got["state"], got["label"], got["tier"], got["released"]) != (state, label, tier, released):
            wrong.append(f"{unit}: shows {got['state']}/{got['label']!r}/{got['tier']}/{got['released']}, the API says {state}/{label!r}/{tier}/{released}")
    assert not wrong, "\n".join(wrong)
    return expected


# ---------------------------------------------------------------------- the checks


def check_headers(api):
    for path in ["/console", "/console/", "/console/console.css", "/console/js/main.js", "/console/js/api.js", "/console/js/dom.js", "/console/js/map.js", "/console/js/occupancy.js", "/console/js/panels.js", "/console/icon.svg", "/console/no-such-file", "/console/js/../../v1/whoami"]:
        status, headers, body = api.send("GET", path, token="")
        headers = {k.lower(): v for k, v in headers.items()}
        want_status = 404 if "no-such" in path or ".." in path else 200
        assert status == want_status, f"{path}: {status}"
        csp = headers.get("content-security-policy", "")
        directives = {d.strip().split(" ")[0]: d.strip().split(" ")[1:] for d in csp.split(";") if d.strip()}
        assert directives.get("default-src") == ["'self'"], f"{path}: CSP {csp!r}"
        for directive in ["script-src", "style-src", "connect-src", "img-src"]:
            assert directives.get(directive) == ["'self'"], f"{path}: {directive} in {csp!r}"
        assert "unsafe" not in csp, f"{path}: {csp!r}"
        assert headers.get("x-content-type-options") == "nosniff", path
        assert headers.get("referrer-policy") == "no-referrer", path
    _, headers, _ = api.send("GET", "/console/js/main.js", token="")
    assert headers["content-type"].startswith("text/javascript"), headers
    status, _, body = api.send("POST", "/console", {}, token="")
    assert status == 405 and json.loads(body)["code"] == "method-not-allowed", (status, body)


def check_key_storage(driver, key):
    assert key not in driver.current_url
    assert js(driver, "return sessionStorage.getItem('gpu-console.api-key')") == key
    assert js(driver, "return localStorage.length") == 0
    assert not driver.get_cookies()
    assert js(driver, "return document.getElementById('api-key').value") == "", "the key stays in the field"


def check_escaping(driver, api, w):
    identity = driver.find_element(By.ID, "identity").text
    assert EVIL_ORG_NAME in identity, identity
    click_unit(driver, "g07")
    details = wait(driver, lambda d: d.find_element(By.ID, "details").text if "g07" in d.find_element(By.ID, "details").text else None, "g07's details")
    assert EVIL_REASON in details and EVIL_CONTRACT in details, details
    timeline = wait(driver, lambda d: d.find_element(By.ID, "timeline").text or None, "the timeline")
    assert RELEASE_REASON in timeline, timeline
    injected = js(driver, "return ['pwned-org','pwned-b','pwned-script','pwned-i','pwned-a','pwned-release'].filter(id => document.getElementById(id))")
    assert injected == [], f"markup from the API became elements: {injected}"
    assert js(driver, "return window.pwned === undefined && document.querySelectorAll('main img, header img, b, i').length === 0")
    click_unit(driver, "g07")  # unselect


def check_states(driver, api, w):
    expected = compare_map(driver, api, w["node"], w["capacity"])
    states = {state for state, *_ in expected.values()}
    assert states >= {"free", "reserved", "released", "running"}, states
    summary = driver.find_element(By.ID, "map-summary").text
    # g00-g09 active and g10-g11 pending are reserved; g00-g04 released; VMs on g00-g02 and
    # g06. The community VM on g13 is another org's on capacity the owner's key neither
    # reserved nor manages, so that key may not read it (vm.read) and the map shows g13 free.
    assert "16 units · 12 reserved · 5 released · 4 running" in summary, summary
    assert expected["g13"][0] == "free"
    # Which reservation holds a unit, and for whom (R1 active for aud, R2 pending).
    extras = js(driver, "return Object.fromEntries([...document.querySelectorAll('#grid [data-unit-id]')].map(c => [c.dataset.unitId, [...c.querySelectorAll('.unit-extra')].map(e => e.innerText).join('|')]))")
    assert extras["g05"] == "R1 · for aud" and extras["g03"] == "R1 · for aud", extras
    assert extras["g10"] == "R2 · pending" and extras["g06"] == "aud" and extras["g00"] == "aud|on released", extras
    rendered = cells(driver)
    looks = {}
    for cell in rendered.values():
        assert cell["label"], f"{cell['id']} has no text label"
        look = (cell["background"], cell["pattern"], cell["border"])
        assert cell["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), f"{cell['id']} ({cell['state']}) has no colour"
        looks.setdefault(cell["state"], set()).add(look)
    # Each state has one look, and no two states share a colour or a pattern.
    for state, variants in looks.items():
        assert len(variants) == 1, f"{state} is drawn {len(variants)} ways: {variants}"
    backgrounds = [next(iter(v))[0] for v in looks.values()]
    patterns = [next(iter(v))[1:] for v in looks.values()]
    assert len(set(backgrounds)) == len(backgrounds), f"two states share a colour: {looks}"
    assert len(set(patterns)) == len(patterns), f"two states share a pattern: {looks}"
    legend = js(
        driver,
        """return [...document.querySelectorAll('#legend .legend-item')].map(li => ({
             state: li.dataset.legend || null, label: li.querySelector('.legend-label').innerText,
             background: getComputedStyle(li.querySelector('.swatch')).backgroundColor }))""",
    )
    by_state = {item["state"]: item for item in legend if item["state"]}
    assert set(by_state) == set(STATE_LABELS), f"legend states: {sorted(by_state)}"
    for state, variants in looks.items():
        assert by_state[state]["background"] == next(iter(variants))[0], f"the legend's {state} differs from the map's"
    node_line = driver.find_element(By.CSS_SELECTOR, f'#node-list [data-node-id="{w["node"]}"] .node-summary').text
    assert node_line == "16 units · 12 reserved · 5 released · 4 running", node_line


def check_needs_review(driver, api, w):
    open_node(driver, w["node2"], 4)
    expected = compare_map(driver, api, w["node2"], w["capacity"])
    assert [u for u, e in expected.items() if e[0] == "needs-review"] == ["h0", "h1"], expected
    review = cells(driver)["h0"]
    assert review["background"] not in ("rgba(0, 0, 0, 0)", "transparent") and review["pattern"] != "none", review
    line = driver.find_element(By.CSS_SELECTOR, f'#node-list [data-node-id="{w["node2"]}"] .node-summary').text
    assert "2 need review" in line, line
    open_node(driver, w["node"], 16)


def check_timeline(driver, api, w):
    events = api.all(f"/v1/audit?reservationId={w['reservation']}", token=w["capacity"])
    button = driver.find_element(By.CSS_SELECTOR, f'#reservation-list [data-reservation-id="{w["reservation"]}"]')
    button.click()
    expected = [e["action"] for e in events]

    def shown_actions(d):
        # The page may render the timeline again between finding its events and reading them.
        try:
            return [e.get_attribute("data-action") for e in d.find_elements(By.CSS_SELECTOR, "#timeline .event")]
        except StaleElementReferenceException:
            return None

    shown = wait(driver, lambda d: (lambda s: s if s == expected else None)(shown_actions(d)), f"{len(events)} events")
    assert shown == expected, (shown, events)


def check_dry_run_and_reclaim(driver, api, w, screenshots):
    before = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    chosen = ["g00", "g01", "g06"]
    for unit in chosen:
        click_unit(driver, unit)
    wait(driver, lambda d: d.find_element(By.ID, "reclaim").is_displayed(), "the Reclaim button")
    assert sorted(u for u, c in cells(driver).items() if c["selected"]) == chosen
    driver.find_element(By.ID, "reason").send_keys("make room")
    driver.find_element(By.ID, "reclaim").click()
    wait(driver, lambda d: d.find_element(By.ID, "plan").is_displayed(), "the dry run's plan")
    api_plan = api.json("POST", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}/reclaim/dry-run", {"unitIds": chosen}, token=w["capacity"])
    assert sorted(api_plan["wouldTerminate"]) == sorted([w["vm_spot_aud"], w["vm_spot_stranger"]]), api_plan
    assert api_plan["wouldSkip"] == [w["vm_verified"]], api_plan
    marks = {u: c["plan"] for u, c in cells(driver).items() if c["plan"]}
    assert marks == {"g00": "terminate", "g01": "terminate", "g02": "terminate", "g06": "skip"}, marks
    listed = {li.get_attribute("data-vm-id"): li.get_attribute("data-verdict") for li in driver.find_elements(By.CSS_SELECTOR, "#plan-body li")}
    assert listed == {w["vm_spot_aud"]: "terminate", w["vm_spot_stranger"]: "terminate", w["vm_verified"]: "skip"}, listed
    screenshot(driver, os.path.join(screenshots, "console-1280x800-dry-run.png"))
    # The dry run changed nothing.
    after = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    assert after["releasedUnitIds"] == before["releasedUnitIds"]
    assert api.json("GET", f"/v1/vms/{w['vm_spot_aud']}", token=w["capacity"])["status"] == "running"
    # Cancel clears the plan and changes nothing.
    driver.find_element(By.ID, "cancel-reclaim").click()
    wait(driver, lambda d: not d.find_element(By.ID, "plan").is_displayed(), "the plan to close")
    assert not any(c["plan"] for c in cells(driver).values())
    assert api.json("GET", f"/v1/vms/{w['vm_spot_aud']}", token=w["capacity"])["status"] == "running"
    # Dry run again, then confirm: the reclaim happens.
    driver.find_element(By.ID, "reclaim").click()
    wait(driver, lambda d: d.find_element(By.ID, "confirm-reclaim").is_displayed(), "Confirm reclaim")
    driver.find_element(By.ID, "confirm-reclaim").click()
    wait(driver, lambda d: "Reclaimed" in d.find_element(By.ID, "outcome").text, "the reclaim's outcome")
    reservation = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    assert not {"g00", "g01"} & set(reservation["releasedUnitIds"]), reservation["releasedUnitIds"]
    for vm, status in [(w["vm_spot_aud"], "terminated"), (w["vm_spot_stranger"], "terminated"), (w["vm_verified"], "running")]:
        got = api.json("GET", f"/v1/vms/{vm}", token=w["capacity"])
        assert got["status"] == status, got
    wait(driver, lambda d: cells(d)["g00"]["state"] == "reserved", "the map to show the reclaim")
    compare_map(driver, api, w["node"], w["capacity"])
    assert not any(c["selected"] for c in cells(driver).values())


def check_keyboard_release(driver, api, w):
    """Select g07 and g08, give a reason and release: keyboard only."""
    grid_stop = driver.find_element(By.CSS_SELECTOR, '#grid [tabindex="0"]')
    grid_stop.send_keys(Keys.HOME)
    for _ in range(7):
        driver.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    assert driver.switch_to.active_element.get_attribute("data-unit-id") == "g07"
    driver.switch_to.active_element.send_keys(Keys.SPACE)
    driver.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    assert sorted(u for u, c in cells(driver).items() if c["selected"]) == ["g07", "g08"]
    assert "g08" in driver.find_element(By.ID, "details").text
    driver.switch_to.active_element.send_keys(Keys.TAB)
    assert driver.switch_to.active_element.get_attribute("id") == "reason", driver.switch_to.active_element.get_attribute("outerHTML")
    driver.switch_to.active_element.send_keys(Keys.CONTROL, "a")
    driver.switch_to.active_element.send_keys("idle for the night")
    driver.switch_to.active_element.send_keys(Keys.TAB)
    assert driver.switch_to.active_element.get_attribute("id") == "release"
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    wait(driver, lambda d: "Released 2 unit(s)" in d.find_element(By.ID, "outcome").text, "the release's outcome")
    reservation = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    assert {"g07", "g08"} <= set(reservation["releasedUnitIds"]), reservation["releasedUnitIds"]
    wait(driver, lambda d: cells(d)["g07"]["state"] == "released", "the map to show the release")
    compare_map(driver, api, w["node"], w["capacity"])
    events = api.all(f"/v1/audit?reservationId={w['reservation']}", token=w["capacity"])
    assert events[-1]["action"].endswith("release") and events[-1].get("reason") == "idle for the night", events[-1]
    wait(driver, lambda d: "idle for the night" in d.find_element(By.ID, "timeline").text, "the timeline to show the release")


def check_refusal(driver, api, w):
    """Releasing a unit under a verified VM is refused: the page shows why, nothing changes."""
    before = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    click_unit(driver, "g06")
    reason = driver.find_element(By.ID, "reason")
    reason.clear()
    reason.send_keys("try it")
    driver.find_element(By.ID, "release").click()
    problem = wait(driver, lambda d: d.find_element(By.ID, "problem") if d.find_element(By.ID, "problem").is_displayed() else None, "the refusal")
    status, _, raw = api.send("POST", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}/release", {"unitIds": ["g06"]}, token=w["capacity"])
    refusal = json.loads(raw)
    assert status == 409, (status, refusal)
    text = problem.text
    assert refusal["title"] in text and refusal["detail"] in text and "g06" in problem.find_element(By.CLASS_NAME, "problem-units").text, text
    assert cells(driver)["g06"]["plan"] is None
    assert js(driver, "return document.querySelector('#grid [data-unit-id=\"g06\"]').dataset.offending") == "true"
    after = api.json("GET", f"/v1/nodes/{w['node']}/reservations/{w['reservation']}", token=w["capacity"])
    assert after["releasedUnitIds"] == before["releasedUnitIds"]
    driver.find_element(By.ID, "clear-selection").click()
    assert not any(c["selected"] for c in cells(driver).values())


def check_refresh(driver, api, w):
    """Refresh reads the API again: a VM stopped elsewhere disappears from the map."""
    api.json("DELETE", f"/v1/vms/{w['vm_verified']}", token=w["aud"])
    assert cells(driver)["g06"]["state"] == "running"
    driver.find_element(By.ID, "refresh").click()
    wait(driver, lambda d: cells(d)["g06"]["state"] == "reserved", "g06 to be reserved after Refresh")
    compare_map(driver, api, w["node"], w["capacity"])


def check_narrow(driver, screenshots):
    viewport(driver, 390, 844, mobile=True)
    overflow = js(driver, "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at 390px"
    for unit in cells(driver).values():
        assert unit["label"], unit
    screenshot(driver, os.path.join(screenshots, "console-390x844.png"), at="map-section")
    viewport(driver, 1280, 800)
    overflow = js(driver, "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at 1280px"


def check_no_rights(driver, api, w):
    """A stranger sees the market's nodes but none of the owner's business, and no buttons."""
    connect(driver, w["stranger"])
    open_node(driver, w["node"], 16)
    rendered = cells(driver)
    expected = compare_map(driver, api, w["node"], w["stranger"])
    assert all(state in ("free", "running") for state, *_ in expected.values())
    assert all(c["state"] in ("free", "running") for c in rendered.values()), rendered
    assert not driver.find_element(By.ID, "actions").is_displayed()
    for button in ["release", "reclaim", "confirm-reclaim"]:
        assert not driver.find_element(By.ID, button).is_displayed(), button
    click_unit(driver, "g03")
    assert not cells(driver)["g03"]["selected"], "a key without reservation.capacity selected a unit"
    assert "None this key may see" in driver.find_element(By.ID, "reservation-list").text
    # A key that may not even list nodes sees nothing at all.
    connect(driver, w["narrow"])
    wait(driver, lambda d: "No nodes this key may see" in d.find_element(By.ID, "nodes-status").text, "an empty node list")
    assert not driver.find_elements(By.CSS_SELECTOR, "#node-list button")
    assert not driver.find_element(By.ID, "actions").is_displayed()
    assert not driver.find_elements(By.CSS_SELECTOR, "#grid [data-unit-id]")
    # A refused key.
    connect(driver, "gpr.key-0000.0000")
    assert "refused" in driver.find_element(By.ID, "identity").text
    driver.find_element(By.ID, "forget").click()
    wait(driver, lambda d: "Paste an API key" in d.find_element(By.ID, "identity").text, "the key to be forgotten")
    assert js(driver, "return sessionStorage.length") == 0


def bad_log_entries(entries):
    """The messages of the browser log that fail the page: a CSP violation, a script error, a
    failed load other than the refusals the test causes."""
    bad = []
    for entry in entries:
        message = entry["message"]
        if "Content Security Policy" in message or "Refused to" in message:
            bad.append(message)
        elif entry["level"] == "SEVERE" and "Failed to load resource" not in message:
            bad.append(message)
        elif "Failed to load resource" in message and not any(f"status of {s}" in message for s in (401, 403, 404, 409)):
            bad.append(message)
    return bad


CONTROL_ERROR = "positive control: a script error the log check must see"
CONTROL_INLINE = "window.positiveControlRan = true"
# Chromium names a refused inline script by its hash.
CONTROL_INLINE_HASH = "sha256-" + base64.b64encode(hashlib.sha256(CONTROL_INLINE.encode()).digest()).decode()


def check_log_catches_errors(driver):
    """The log check sees what it looks for: a script error thrown in the page and an inline
    script the page's CSP must refuse, both made on purpose, are read from the browser's log
    and judged bad; nothing else logged so far is."""
    js(driver, f"setTimeout(function () {{ throw new Error({CONTROL_ERROR!r}); }}, 0);")
    js(driver, f"var s = document.createElement('script'); s.textContent = {CONTROL_INLINE!r}; document.head.appendChild(s);")
    entries = []

    def both_seen(d):
        entries.extend(d.get_log("browser"))
        bad = bad_log_entries(entries)
        return any(CONTROL_ERROR in m for m in bad) and any(CONTROL_INLINE_HASH in m for m in bad)

    wait(driver, both_seen, "the positive controls in the browser log")
    assert js(driver, "return window.positiveControlRan === undefined"), "the CSP let an inline script run"
    others = [m for m in bad_log_entries(entries) if CONTROL_ERROR not in m and CONTROL_INLINE_HASH not in m]
    assert not others, "\n".join(others)


def check_browser_log(driver):
    """No CSP violation, no script error; failed loads only for the refusals the test caused."""
    bad = bad_log_entries(driver.get_log("browser"))
    assert not bad, "\n".join(bad)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--screenshots", required=True)
    args = parser.parse_args()
    os.makedirs(args.screenshots, exist_ok=True)
    state = tempfile.mkdtemp(prefix="console-test-state.")
    profile = tempfile.mkdtemp(prefix="console-test-profile.")
    process = driver = None
    checks = Checks()
    try:
        process, api = start_host(args.host, args.manifest, state)
        checks.run("headers of the page, its assets and a 404", check_headers, api)
        driver = browser(profile)
        scene = build_scene(api)
        checks.run("the picture: a dry run on a realistic node", take_picture, driver, api, scene, os.path.join(args.screenshots, "console.png"))
        w = build_world(api)
        driver.get(api.base + "/console")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#legend .legend-item"), "the page's modules to run")
        checks.run("the log check catches a script error and a CSP violation (positive control)", check_log_catches_errors, driver)
        connect(driver, w["capacity"], press_enter=False)
        checks.run("the key is in sessionStorage only", check_key_storage, driver, w["capacity"])
        open_node(driver, w["node"], 16)
        checks.run("every unit shows the API's state, each state its own colour, pattern and label", check_states, driver, api, w)
        checks.run("needs-review units on the second node", check_needs_review, driver, api, w)
        checks.run("markup in names and reasons is shown as text", check_escaping, driver, api, w)
        checks.run("the reservation's audit trail as a timeline", check_timeline, driver, api, w)
        screenshot(driver, os.path.join(args.screenshots, "console-1280x800.png"))
        checks.run("dry run on the map, cancel, then confirm the reclaim", check_dry_run_and_reclaim, driver, api, w, args.screenshots)
        checks.run("release with the keyboard alone", check_keyboard_release, driver, api, w)
        checks.run("a refused release shows title, detail and units", check_refusal, driver, api, w)
        checks.run("Refresh reads the API again", check_refresh, driver, api, w)
        checks.run("readable at 390x844 and 1280x800", check_narrow, driver, args.screenshots)
        checks.run("keys without rights see emptiness and no buttons", check_no_rights, driver, api, w)
        checks.run("no CSP violation or script error in the browser log", check_browser_log, driver)
    except Exception:  # noqa: BLE001
        checks.failed.append("set-up")
        print(f"FAIL set-up\n{traceback.format_exc()}", flush=True)
    finally:
        if driver is not None:
            driver.quit()
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        if checks.failed:
            print(f"host log: {state}/host.log", flush=True)
        else:
            shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(profile, ignore_errors=True)
    print(f"screenshots in {args.screenshots}")
    print(f"console: {checks.passed} passed, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
