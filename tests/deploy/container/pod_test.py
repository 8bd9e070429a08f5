#!/usr/bin/env python3
"""The agent's image run as Kubernetes would run the chart's DaemonSet, with podman.

For each profile (default, GKE A3 Ultra, EKS p5, GKE with DRANet) the chart is rendered with helm exactly
as users render it; the rendered pod template (not a copy of it) becomes podman
containers: its init containers, then ferryd with the pod's and container's
securityContext (user, groups, capabilities, privileged, no_new_privs), env (the
downward API's status.hostIP as this node's 127.0.0.1), command and args with $(VAR)
expansion, volumes (hostPath under a directory that plays the node's root, the
ConfigMap's files, emptyDirs), memory limit and host network. Then, as the kubelet and
serving pods would:

- the startup, readiness and liveness probes, as the pod spec states them;
- grpc-health-probe against the socket from a workload container;
- two workload containers run as deploy/examples tell serving pods to run (its decode
  pod's securityContext and socket mount) move a checksummed buffer through the agent;
- /metrics counts the bytes;
- a SIGTERM while a sender writes: the agent drains and exits 0 within the pod's
  terminationGracePeriodSeconds, and the sender ends with a status, not a hang;
- without the pod's supplementalGroups (the chart before it set them), the agent stops at
  once with a message that names the setting.

What differs from a node, and why: NIC selection only (this machine has no RDMA NICs:
fabric.provider auto, loopback interface, no RDMA discovery), free ports instead of
9464 / 7700, and hostPath directories of type Directory created by the test as the node
would have them (/dev/infiniband, the NVIDIA driver directory: empty here). The DRA
profiles' init container reads the pod's claim from the API server, which podman lacks:
the test writes the file it would write (the loopback device as the claimed NIC, with a
PCIe root and NUMA node, under DRANet's attribute names for GKE and the EFA driver's own
domain for EKS), and the pod, which has no host network, gets the host's all
the same (podman's own networks are not set up on these machines); tools/k8s/node_e2e.sh
runs that init container and the pod's own network on a real node.

    tests/deploy/container/pod_test.py --image ferry/ferryd:0.1.0 --workload PATH --helm PATH \
        --health_probe PATH [--profile default ...]
"""
import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHART = os.path.join(ROOT, "deploy/helm/ferry")
EXAMPLE = os.path.join(ROOT, "deploy/examples/prefill-decode.yaml")
PROFILES = {
    "default": [],
    "gke-a3-ultra": ["-f", os.path.join(CHART, "values-gke-a3-ultra.yaml")],
    "eks-p5": ["-f", os.path.join(CHART, "values-eks-p5.yaml")],
    "gke-dra": ["-f", os.path.join(CHART, "values-gke-dra.yaml")],
    "eks-dra": ["-f", os.path.join(CHART, "values-eks-dra.yaml")],
}
# What `ferryctl claimed-devices` writes for a claim of one NIC, here the loopback device:
# as DRANet publishes it (GKE), and as a driver that keeps its attributes in its own domain
# publishes it (the EKS profile's efa.networking.k8s.aws; aws-dranet's own names could not be
# checked here, so the agent's fallback to the driver's domain is what this plays).
CLAIM_DRIVER = {"gke-dra": "dra.net", "eks-dra": "efa.networking.k8s.aws"}


def claimed_loopback(driver: str) -> str:
    return json.dumps({"pod": "ferry/ferry-test", "node": "node-1", "devices": [{
        "claim": "nics", "request": "nics", "driver": driver, "pool": "node-1", "device": "pci-0000-91-00-0",
        "attributes": {f"{driver}/ifName": {"string": "lo"}, f"{driver}/rdma": {"bool": True},
                       f"{driver}/numaNode": {"int": 0},
                       "resource.kubernetes.io/pcieRoot": {"string": "pci0000:8c"}}}]})


# A node's default locked-memory limit under containerd; open files as this machine allows
# and processes as podman's conmon allows (podman drops its default limits once one is given).
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
ULIMITS = ["--ulimit", "memlock=8388608:8388608", "--ulimit", f"nofile={_NOFILE}:{_NOFILE}",
           "--ulimit", "nproc=32768:32768"]
NODE_IP = "127.0.0.1"


class Failure(Exception):
    pass


def run(cmd, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise Failure(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(helm: str, profile: str, metrics_port: int, peer_port: int):
    """The DaemonSet and ConfigMap as `helm template` renders them for `profile`. The GKE
    and EKS profiles name NICs this machine lacks: they get its node address instead. The
    default profile is rendered as it is (it finds its NIC by the node's address)."""
    nics = [] if profile == "default" else [
        "--set", "fabric.provider=auto", "--set", f"fabric.ifaces={{{NODE_IP}}}",
        "--set", "fabric.discoverRdmaDevices=false"]
    if profile in CLAIM_DRIVER:  # the claim names the NIC; no GPU DRA driver here
        nics = ["--set", "fabric.provider=auto", "--set", "dra.gpuDeviceClassName="]
    out = run([helm, "template", "ferry", CHART, "--namespace", "ferry", *PROFILES[profile], *nics,
               "--set", f"metricsPort={metrics_port}", "--set", f"peerPort={peer_port}"]).stdout
    objs = {d["kind"]: d for d in yaml.safe_load_all(out) if d}
    return objs["DaemonSet"], objs["ConfigMap"]


def expand(s: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in command and args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


class Pod:
    """One pod's containers in podman, on a node whose root is `node_root`."""

    def __init__(self, name: str, spec: dict, node_root: str, configmaps: dict, label: str):
        self.name, self.spec, self.node_root, self.label = name, spec, node_root, label
        self.volumes = {}
        for v in spec.get("volumes", []):
            if "hostPath" in v:
                path = node_root + v["hostPath"]["path"]
                os.makedirs(path, exist_ok=True)  # DirectoryOrCreate, or a Directory the node has
            elif "configMap" in v:
                path = os.path.join(node_root, "var/lib/kubelet", name, v["name"])
                os.makedirs(path, exist_ok=True)
                for key, data in configmaps[v["configMap"]["name"]]["data"].items():
                    with open(os.path.join(path, key), "w") as f:
                        f.write(data)
            elif "emptyDir" in v or "projected" in v:  # projected: the API token, for an init container not run
                path = os.path.join(node_root, "var/lib/kubelet", name, v["name"])
                os.makedirs(path, exist_ok=True)
                os.chmod(path, 0o777)
            else:
                raise Failure(f"volume {v['name']}: only hostPath, configMap and emptyDir are played here")
            self.volumes[v["name"]] = path

    def args(self, c: dict, image: str, extra_mounts=()) -> list:
        pod_sc, sc = self.spec.get("securityContext", {}), c.get("securityContext", {})
        cname = f"{self.name}-{c['name']}"
        a = ["podman", "run", "-d", "--name", cname, "--label", self.label, *ULIMITS]
        # A pod with claimed NICs has a network of its own on a node; here it gets the host's
        # (module docstring). Workload pods need none: they reach the agent by its socket.
        host_net = self.spec.get("hostNetwork") or self.spec.get("resourceClaims")
        a.append("--network=host" if host_net else "--network=none")
        uid, gid = sc.get("runAsUser", pod_sc.get("runAsUser")), sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and not uid:
            raise Failure(f"{cname}: runAsNonRoot without a non-zero runAsUser (the kubelet would refuse it)")
        if uid is not None or gid is not None:
            a += ["--user", f"{uid or 0}:{gid or 0}"]
        for g in pod_sc.get("supplementalGroups", []):
            a += ["--group-add", str(g)]
        if sc.get("privileged"):
            a.append("--privileged")
        caps = sc.get("capabilities", {})
        if "ALL" in caps.get("drop", []):
            a.append("--cap-drop=all")
        a += [f"--cap-add={cap}" for cap in caps.get("add", [])]
        if sc.get("allowPrivilegeEscalation") is False:
            a.append("--security-opt=no-new-privileges")
        if sc.get("readOnlyRootFilesystem"):
            a.append("--read-only")
        memory = c.get("resources", {}).get("limits", {}).get("memory")
        if memory:
            a += ["--memory", memory.replace("Gi", "g").replace("Mi", "m")]
        env = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in ("status.hostIP", "status.podIP"):
                env[e["name"]] = NODE_IP
            else:
                raise Failure(f"{cname}: env {e['name']}: only values and status.hostIP are played here")
        for k, v in env.items():
            a += ["-e", f"{k}={v}"]
        for m in c.get("volumeMounts", []):
            a += ["-v", f"{self.volumes[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"]
        for src, dst in extra_mounts:
            a += ["-v", f"{src}:{dst}:ro"]
        command = [expand(x, env) for x in c.get("command", [])]
        if command:
            a += ["--entrypoint", command[0]]
        a.append(image)
        return a + command[1:] + [expand(x, env) for x in c.get("args", [])]


def logs(name: str) -> str:
    r = run(["podman", "logs", name], check=False)
    return (r.stdout + r.stderr).strip()


def wait_exit(name: str, timeout: float) -> int:
    try:
        r = run(["podman", "wait", name], timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"{name} still running after {timeout} s; its log:\n{logs(name)}")
    return int(r.stdout.strip().splitlines()[-1])


def http_probe(probe: dict, ports: dict) -> bool:
    get = probe["httpGet"]
    port = ports.get(get["port"], get["port"])
    try:
        with urllib.request.urlopen(f"http://{NODE_IP}:{port}{get['path']}", timeout=probe.get("timeoutSeconds", 1)):
            return True
    except (urllib.error.URLError, OSError):
        return False


def await_probe(kind: str, probe: dict, ports: dict, container: str) -> float:
    """As the kubelet does: every periodSeconds until it passes, at most failureThreshold
    failures. Returns the seconds it took."""
    start = time.monotonic()
    for _ in range(probe.get("failureThreshold", 3)):
        if http_probe(probe, ports):
            return time.monotonic() - start
        if run(["podman", "inspect", "-f", "{{.State.Running}}", container]).stdout.strip() != "true":
            raise Failure(f"{container} exited before its {kind} probe passed; its log:\n{logs(container)}")
        time.sleep(probe.get("periodSeconds", 10))
    raise Failure(f"{container}: the {kind} probe failed {probe.get('failureThreshold', 3)} times; "
                  f"its log:\n{logs(container)}")


def workload_pod(node_root: str, label: str, name: str):
    """A serving pod as deploy/examples tells users to write one: its decode pod's pod and
    container securityContext and its mount of the agent's socket directory."""
    example = next(d for d in yaml.safe_load_all(open(EXAMPLE)) if d and d["kind"] == "Pod")
    spec = example["spec"]
    container = spec["containers"][0]
    socket_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/run/ferry")
    pod_spec = {"hostNetwork": False, "securityContext": spec["securityContext"],
                "volumes": [v for v in spec["volumes"] if v["name"] == socket_mount["name"]] +
                           [{"name": "exchange", "emptyDir": {}}]}
    pod = Pod(name, pod_spec, node_root, {}, label)
    shared = {"name": container["name"], "securityContext": container["securityContext"],
              "volumeMounts": [socket_mount, {"name": "exchange", "mountPath": "/exchange"}]}
    return pod, shared


def write_claim(pod: "Pod", init: dict, profile: str) -> str:
    """Writes what the claimed-devices init container would, where it would: its --out
    path inside the volume it mounts there. Returns the path on this machine."""
    out_path = next(a for a in init["command"] if a.startswith("--out="))[len("--out="):]
    mount = next(m for m in init["volumeMounts"] if out_path.startswith(m["mountPath"] + "/"))
    path = pod.volumes[mount["name"]] + out_path[len(mount["mountPath"]):]
    with open(path, "w") as f:
        f.write(claimed_loopback(CLAIM_DRIVER[profile]))
    return path


def check_profile(profile: str, args, out) -> None:
    metrics_port, peer_port = free_port(), free_port()
    ds, cm = render(args.helm, profile, metrics_port, peer_port)
    tmpl = ds["spec"]["template"]
    spec = tmpl["spec"]
    label = f"ferry-pod-test={os.getpid()}-{profile}"
    node_root = tempfile.mkdtemp(prefix=f"fp-{profile[:3]}-", dir="/tmp")
    started = time.monotonic()
    try:
        configmaps = {cm["metadata"]["name"]: cm}
        agent = Pod(f"ferry-{profile}", spec, node_root, configmaps, label)
        for init in spec.get("initContainers", []):
            if init["name"] == "claimed-devices":
                out(f"{profile}: init container claimed-devices played by the file it writes "
                    f"({write_claim(agent, init, profile)})")
                continue
            run(agent.args(init, args.image))
            code = wait_exit(f"{agent.name}-{init['name']}", 60)
            if code != 0:
                raise Failure(f"init container {init['name']} exited {code}: {logs(agent.name + '-' + init['name'])}")
        c = spec["containers"][0]
        name = f"{agent.name}-{c['name']}"
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        run(agent.args(c, args.image))
        t = await_probe("startup", c["startupProbe"], ports, name)
        await_probe("readiness", c["readinessProbe"], ports, name)
        await_probe("liveness", c["livenessProbe"], ports, name)
        out(f"{profile}: ferryd started with the rendered securityContext; startup probe passed after {t:.1f} s, "
            "readiness and liveness pass")
        if "--claimed_devices" in " ".join(c.get("args", [])):
            said = logs(name)
            if f"claimed NIC lo ({CLAIM_DRIVER[profile]}/node-1/pci-0000-91-00-0)" not in said:
                raise Failure(f"ferryd did not take its NIC from the claim: {said[-1500:]}")
            out(f"{profile}: ferryd took its fabric NIC from the claimed devices (lo, PCIe root pci0000:8c, NUMA 0)")

        wl, shared = workload_pod(node_root, label, f"serving-{profile}")
        probe_mount = [(args.health_probe, "/opt/ferry-test/grpc-health-probe")]
        run(wl.args({**shared, "name": "health", "command": ["/opt/ferry-test/grpc-health-probe"],
                     "args": ["-addr=unix:///run/ferry/ferry.sock"]}, args.image, probe_mount))
        if wait_exit(f"{wl.name}-health", 30) != 0:
            raise Failure(f"grpc-health-probe from a workload container: {logs(wl.name + '-health')}")
        out(f"{profile}: grpc-health-probe from a workload container (uid/gid of the example pod): SERVING")

        mounts = [(args.workload, "/opt/ferry-test/pod_workload")]
        size = 32 << 20
        for role in ("receiver", "sender"):
            run(wl.args({**shared, "name": role, "command": ["/opt/ferry-test/pod_workload"],
                         "args": [f"--role={role}", f"--bytes={size}", "--rounds=4"]}, args.image, mounts))
        for role in ("sender", "receiver"):
            if wait_exit(f"{wl.name}-{role}", 90) != 0:
                raise Failure(f"the {role} workload container failed: {logs(wl.name + '-' + role)}")
        out(f"{profile}: two workload containers moved {size >> 20} MiB x 4 through the agent; every byte checked "
            f"({logs(wl.name + '-receiver')})")

        with urllib.request.urlopen(f"http://{NODE_IP}:{metrics_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        moved = sum(float(m.group(1)) for m in re.finditer(
            r'^ferry_transfer_bytes_total\{[^}]*direction="tx"[^}]*\} (\S+)$', metrics, re.M))
        if moved < 4 * size:
            raise Failure(f"/metrics counts {moved:.0f} bytes sent, expected at least {4 * size}")
        out(f"{profile}: /metrics scraped, ferry_transfer_bytes_total{{direction=\"tx\"}} = {moved:.0f}")

        # A SIGTERM while a sender writes: the agent drains within the pod's grace period.
        drain = Pod(f"drain-{profile}", wl.spec, node_root, {}, label)
        run(drain.args({**shared, "name": "receiver", "command": ["/opt/ferry-test/pod_workload"],
                        "args": ["--role=receiver", "--bytes=67108864", "--wait_seconds=60"]}, args.image, mounts))
        run(drain.args({**shared, "name": "sender", "command": ["/opt/ferry-test/pod_workload"],
                        "args": ["--role=sender", "--bytes=67108864", "--rounds=100000"]}, args.image, mounts))
        time.sleep(2)
        grace = spec["terminationGracePeriodSeconds"]
        t0 = time.monotonic()
        run(["podman", "stop", "-t", str(grace), name], timeout=grace + 30)
        took = time.monotonic() - t0
        code = int(run(["podman", "inspect", "-f", "{{.State.ExitCode}}", name]).stdout.strip())
        if code != 0:
            raise Failure(f"after SIGTERM ferryd exited {code} in {took:.1f} s (grace {grace} s): {logs(name)[-2000:]}")
        sender_code = wait_exit(f"{drain.name}-sender", 40)
        said = logs(f"{drain.name}-sender").splitlines()
        out(f"{profile}: SIGTERM with a write in flight: ferryd drained and exited 0 in {took:.1f} s (grace {grace} s); "
            f"the sender ended (exit {sender_code}): {said[-1] if said else ''}")
        run(["podman", "rm", "-f", "-t", "0", f"{drain.name}-receiver", name], check=False)

        if not spec.get("securityContext", {}).get("supplementalGroups") or c["securityContext"].get("privileged"):
            return
        # The chart before it set the pod's supplementalGroups: a clear error, not a crash loop.
        bare = dict(spec, securityContext={k: v for k, v in spec["securityContext"].items()
                                           if k != "supplementalGroups"})
        old = Pod(f"nogroup-{profile}", bare, node_root, configmaps, label)
        for init in spec.get("initContainers", []):
            if init["name"] == "claimed-devices":
                write_claim(old, init, profile)
        run(old.args(c, args.image))
        code = wait_exit(f"{old.name}-{c['name']}", 20)
        said = logs(f"{old.name}-{c['name']}")
        if code == 0 or "supplementalGroups" not in said or "--socket_group" not in said:
            raise Failure(f"without supplementalGroups ferryd exited {code} with: {said[-1500:]}")
        out(f"{profile}: without the pod's supplementalGroups ferryd exits {code} at once, saying: "
            f"{said.splitlines()[-1][-300:]}")
    finally:
        ids = run(["podman", "ps", "-aq", "--filter", f"label={label}"], check=False).stdout.split()
        if ids:
            run(["podman", "rm", "-f", "-t", "0", *ids], check=False)
        shutil.rmtree(node_root, ignore_errors=True)
        out(f"{profile}: {time.monotonic() - started:.0f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True)
    p.add_argument("--workload", required=True, help="pod_workload binary")
    p.add_argument("--helm", required=True)
    p.add_argument("--health_probe", required=True, help="grpc-health-probe binary")
    p.add_argument("--profile", action="append", choices=sorted(PROFILES))
    args = p.parse_args()
    args.workload, args.health_probe = os.path.realpath(args.workload), os.path.realpath(args.health_probe)
    passed = failed = 0
    for profile in args.profile or list(PROFILES):
        try:
            check_profile(profile, args, lambda s: print(s, flush=True))
            passed += 1
        except (Failure, subprocess.TimeoutExpired) as e:
            print(f"FAILED {profile}: {e}", flush=True)
            failed += 1
    print(f"pod_test: {passed} profiles passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
