"""The standard gRPC services on the agent's local socket, driven by the standard tools
(grpcurl through server reflection, grpc-health-probe as a Kubernetes probe runs it)
against a live ferryd. tools/setup.sh builds both from the Go module proxy."""
import json
import signal
import subprocess
import time

from conftest import REPO

BIN = REPO / "tools/go/bin"


def tool(name: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    path = BIN / name
    assert path.exists(), f"{path} is missing: run tools/setup.sh"
    return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=timeout)


def grpcurl(agent, *args: str, flags: tuple = ()) -> subprocess.CompletedProcess:
    return tool("grpcurl", "-plaintext", "-unix", *flags, agent.socket, *args)


def probe(agent, *args: str) -> subprocess.CompletedProcess:
    return tool("grpc-health-probe", f"-addr=unix://{agent.socket}", *args)


def test_health_says_serving_for_the_server_and_the_api(agent):
    for service in ([], ["-service=ferry.v1.Agent"]):
        r = probe(agent, *service)
        assert r.returncode == 0 and "status: SERVING" in r.stdout + r.stderr, (service, r.stdout, r.stderr)
    r = probe(agent, "-service=ferry.v1.NoSuchService")
    assert r.returncode != 0 and "unknown" in r.stderr, r.stderr


def test_health_says_not_serving_while_the_agent_drains(fabric_agents):
    """SIGTERM with a write in flight: the agent drains (--shutdown_grace_ms) and says
    NOT_SERVING meanwhile, so a probe takes the node out before the socket goes."""
    import ferry
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src = ca.register_host(4096)
        dst = cb.register_host(4096)
        ca.write(src, dst.descriptor(), [(0, 0, 8)]).result(30)  # handshake done, peer cached
        b.proc.send_signal(signal.SIGSTOP)  # b stops acknowledging: the next write stays in flight
        try:
            pending = ca.write(src, dst.descriptor(), [(0, 0, 8)], timeout=20)
            assert not pending.done()
            a.proc.send_signal(signal.SIGTERM)
            # Probes until one says NOT_SERVING: before the agent reads the signal they say
            # SERVING, and on a loaded machine a probe still starting when the drain ends
            # meets the server's shutdown instead (CANCELLED); neither ends the wait.
            deadline = time.monotonic() + 5
            r = probe(a)
            while "NOT_SERVING" not in r.stdout + r.stderr and time.monotonic() < deadline:
                time.sleep(0.05)
                r = probe(a)
            assert r.returncode != 0 and "NOT_SERVING" in (r.stdout + r.stderr), (r.stdout, r.stderr, pending.done())
        finally:
            b.proc.send_signal(signal.SIGCONT)


def test_reflection_lists_and_describes_the_api(agent):
    r = grpcurl(agent, "list")
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) >= {"ferry.v1.Agent", "grpc.health.v1.Health",
                                     "grpc.reflection.v1alpha.ServerReflection"}
    r = grpcurl(agent, "describe", "ferry.v1.Agent")
    assert r.returncode == 0 and "rpc Write ( .ferry.v1.WriteRequest )" in r.stdout, r.stdout
    r = grpcurl(agent, "describe", "ferry.v1.WriteRequest")
    assert r.returncode == 0 and "src_region_id" in r.stdout, r.stdout


def test_grpcurl_calls_the_api_without_the_proto(agent):
    r = grpcurl(agent, "ferry.v1.Agent/GetStatus")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["socket"] == agent.socket and status["version"]
    # Calls that need a session say so, with the code a client can act on.
    r = grpcurl(agent, "ferry.v1.Agent/Write", flags=("-d", '{"src_region_id": 1}'))
    assert r.returncode != 0 and "Unauthenticated" in r.stderr, r.stderr
