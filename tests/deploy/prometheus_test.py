"""The dashboard and the rules against a real Prometheus scraping two real agents.

Starts two ferryd processes (fabric tcp;ofi_rxm on 127.0.0.1 and 127.0.0.2), Debian's
Prometheus server on loopback scraping both every second with
deploy/prometheus/ferry-rules.yaml loaded, and runs tests/deploy:metrics_workload
(cross-agent, paged, node-local transfers, registrations, refused requests). Then:

- every PromQL expression of deploy/grafana/ferry.json, with the dashboard variables
  set to "All", must return data through the HTTP API;
- every recording rule must have produced series, and every rule must be healthy;
- every metric the dashboard or the rules name must be one the agent exports, and every
  ferry_ metric the agent exports must be in agent/metrics/README.md's table (names are an
  interface: they must not drift).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", "."), "ferry")


def runfile(path):
    return os.path.join(RUNFILES, path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_until(what, check, seconds):
    """Polls check() until it returns a truthy value or `seconds` pass (bounded)."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as e:  # server not up yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out after {seconds}s waiting for {what} (last: {last!r})")


def read_text(path):
    with open(path) as f:
        return f.read()


def read_ready(path):
    return dict(line.split("=", 1) for line in read_text(path).split())


def exported_names(exposition):
    return {m.group(1) for m in re.finditer(r"^# TYPE (ferry_\w+) ", exposition, re.M)}


def base_name(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def referenced_metrics(expr):
    """ferry_* metric names an expression reads (recording-rule names contain ':')."""
    return {base_name(n) for n in re.findall(r"(?<![:\w])(ferry_\w+)", expr)}


def readme_metric_names():
    text = read_text(runfile("agent/metrics/README.md"))
    return set(re.findall(r"^\| `(ferry_\w+)` \|", text, re.M))


class PrometheusEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("prometheus") is None:
            raise AssertionError("prometheus is not installed: run tools/setup.sh")
        cls.procs = []
        cls.dir = tempfile.mkdtemp(prefix="fprom.", dir="/tmp")
        cls.agents = []
        for name, addr in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
            ready = os.path.join(cls.dir, name + ".ready")
            with open(os.path.join(cls.dir, name + ".log"), "w") as log:
                cls.procs.append(subprocess.Popen(
                    [runfile("agent/main/ferryd"), f"--socket={cls.dir}/{name}.sock",
                     "--metrics_address=127.0.0.1:0", f"--peer_address={addr}:0", f"--fabric_iface={addr}",
                     "--fabric_provider=tcp;ofi_rxm", f"--ready_file={ready}", "--log_level=warning"],
                    stdout=log, stderr=subprocess.STDOUT))
            wait_until(f"agent {name} ready", lambda: os.path.exists(ready), 20)
            cls.agents.append(read_ready(ready))

        cls.prom_port = free_port()
        targets = ", ".join(f'"127.0.0.1:{a["metrics_port"]}"' for a in cls.agents)
        config = os.path.join(cls.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{runfile('deploy/prometheus/ferry-rules.yaml')}"]
scrape_configs:
  - job_name: ferry
    static_configs:
      - targets: [{targets}]
        labels: {{cluster: e2e}}
""")
        with open(os.path.join(cls.dir, "prometheus.log"), "w") as log:
            cls.procs.append(subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={cls.dir}/tsdb",
                 f"--web.listen-address=127.0.0.1:{cls.prom_port}"],
                stdout=log, stderr=subprocess.STDOUT))
        wait_until("both targets up", lambda: cls.up_targets() == 2, 30)

        # Traffic while Prometheus scrapes, then a few more scrapes and rule evaluations.
        workload = subprocess.run(
            [runfile("tests/deploy/metrics_workload"), f"--socket_a={cls.agents[0]['socket']}",
             f"--socket_b={cls.agents[1]['socket']}", "--seconds=8"],
            capture_output=True, text=True, timeout=60)
        if workload.returncode != 0:
            raise AssertionError(f"workload failed: {workload.stdout}{workload.stderr}")
        time.sleep(3)

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.procs):
            p.send_signal(signal.SIGTERM)
        for p in cls.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def api(cls, path, **params):
        url = f"http://127.0.0.1:{cls.prom_port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        body = json.loads(http_get(url))
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    @classmethod
    def up_targets(cls):
        return sum(t["health"] == "up" for t in cls.api("targets")["activeTargets"])

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def dashboard_exprs(self):
        dash = json.loads(read_text(runfile("deploy/grafana/ferry.json")))
        exprs = []
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                exprs.append((panel["title"], t["expr"]))
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                exprs.append((f"variable {var['name']}", var["query"]["query"]))
        self.assertGreater(len(exprs), 20)
        return exprs

    def test_every_dashboard_expression_returns_data(self):
        empty = []
        for title, expr in self.dashboard_exprs():
            if expr.startswith("label_values("):
                m = re.match(r"label_values\((.*), (\w+)\)$", expr)
                values = self.api("label/" + m.group(2) + "/values", **{"match[]": m.group(1).replace("$cluster", ".*")})
                if not values:
                    empty.append((title, expr))
                continue
            q = expr.replace("$__rate_interval", "1m").replace("$cluster", ".*").replace("$instance", ".*")
            if not self.query(q):
                empty.append((title, q))
        self.assertEqual(empty, [], "dashboard expressions without data")

    def rules(self):
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]

    def test_every_rule_is_healthy_and_every_recording_rule_has_data(self):
        rules = self.rules()
        self.assertGreaterEqual(len(rules), 12)
        for r in rules:
            self.assertEqual(r["health"], "ok", f"{r['name']}: {r.get('lastError')}")
        recorded = [r["name"] for r in rules if r["type"] == "recording"]
        self.assertGreaterEqual(len(recorded), 7)
        for name in recorded:
            self.assertTrue(self.query(name), f"recording rule {name} produced no series")

    def test_metric_names_match_the_agent_and_the_readme(self):
        exposition = http_get(f"http://127.0.0.1:{self.agents[0]['metrics_port']}/metrics")
        exported = exported_names(exposition)
        self.assertIn("ferry_transfer_bytes_total", exported)
        used = set()
        for _, expr in self.dashboard_exprs():
            used |= referenced_metrics(expr)
        for r in self.rules():
            used |= referenced_metrics(r["query"])
        self.assertEqual(used - exported, set(), "dashboard/rules use metrics the agent does not export")
        self.assertEqual(exported - readme_metric_names(), set(), "exported metrics missing from agent/metrics/README.md's table")
        # Children of these appear once the agent copies on a GPU (this test's agents have none).
        only_with_a_gpu = {"ferry_gpu_transfers_total"}
        self.assertEqual(readme_metric_names() - exported - only_with_a_gpu, set(),
                         "agent/metrics/README.md documents metrics the agent lacks")

    def test_traffic_shows_up_per_path_and_direction(self):
        rows = self.query('sum by (instance, path, direction) (ferry_transfer_bytes_total{cluster="e2e"}) > 0')
        seen = {(r["metric"]["path"], r["metric"]["direction"]) for r in rows}
        for want in (("fabric", "tx"), ("fabric", "rx"), ("local", "tx"), ("local", "rx")):
            self.assertIn(want, seen)
        refused = self.query('sum by (code) (ferry_errors_total{api="Write"})')
        self.assertEqual({r["metric"]["code"] for r in refused} >= {"PERMISSION_DENIED", "OUT_OF_RANGE"}, True)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
