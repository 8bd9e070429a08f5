"""deploy/prometheus/ferry-rules.yaml passes promtool's checks and its unit tests, and
deploy/grafana/ferry.json is a well-formed dashboard (the Prometheus end-to-end test
checks that its queries return data)."""

import json
import os
import shutil
import subprocess
import unittest

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", "."), "ferry")


def runfile(path):
    return os.path.join(RUNFILES, path)


class Rules(unittest.TestCase):
    def promtool(self, *args):
        self.assertIsNotNone(shutil.which("promtool"), "promtool is not installed: run tools/setup.sh")
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_check_rules(self):
        out = self.promtool("check", "rules", runfile("deploy/prometheus/ferry-rules.yaml"))
        self.assertIn("SUCCESS: 12 rules found", out)

    def test_unit_tests_of_the_alerts(self):
        self.promtool("test", "rules", runfile("deploy/prometheus/ferry-rules_test.yaml"))


class Dashboard(unittest.TestCase):
    def test_panels_are_well_formed(self):
        with open(runfile("deploy/grafana/ferry.json")) as f:
            dash = json.load(f)
        names = [v["name"] for v in dash["templating"]["list"]]
        self.assertEqual(names, ["datasource", "cluster", "instance"])
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        for p in dash["panels"]:
            if p["type"] == "row":
                continue
            self.assertTrue(p["targets"], p["title"])
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            for t in p["targets"]:
                # Every query is scoped by the dashboard's cluster and node selectors.
                self.assertIn('cluster=~"$cluster"', t["expr"], p["title"])
                self.assertIn('instance=~"$instance"', t["expr"], p["title"])


if __name__ == "__main__":
    unittest.main()
