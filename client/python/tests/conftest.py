"""Starts real ferryd processes for the tests (no mocks): FERRYD names the binary
(default: the repository's bazel-bin/agent/main/ferryd)."""
import os
import pathlib
import signal
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


class Agent:
    def __init__(self, *flags: str, dir: str = "", wrap=()):
        binary = os.environ.get("FERRYD", str(REPO / "bazel-bin/agent/main/ferryd"))
        self.killed = False
        self.flags, self.wrap = flags, wrap
        self.dir = dir or tempfile.mkdtemp(prefix="fy.py.", dir="/tmp")  # unix socket paths are short
        self.socket = f"{self.dir}/ferry.sock"
        ready = f"{self.dir}/ready"
        if os.path.exists(ready):
            os.unlink(ready)
        self.log = open(f"{self.dir}/ferryd.log", "wb")
        self.proc = subprocess.Popen([*wrap, binary, f"--socket={self.socket}", "--metrics_address=127.0.0.1:0",
                                      f"--ready_file={ready}", *flags], stderr=self.log)
        deadline = time.monotonic() + 20
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"ferryd did not start: {open(self.log.name).read()}")
            time.sleep(0.02)

    def ready(self) -> dict:
        """What the agent wrote to its --ready_file: pid, metrics_port, peer_address, ..."""
        with open(f"{self.dir}/ready") as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)

    def kill(self) -> None:
        """SIGKILL: the agent dies without cleaning up (stale socket files stay)."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1


@pytest.fixture
def agent():
    a = Agent()
    yield a
    code = a.stop()
    assert code == 0, f"ferryd exited with {code}: {open(a.log.name).read()[-2000:]}"


@pytest.fixture
def fabric_agents(agent_factory):
    """Two agents with a fabric (tcp;ofi_rxm on 127.0.0.1 and 127.0.0.2), as two nodes."""
    return tuple(agent_factory(f"--peer_address={ip}:0", f"--fabric_iface={ip}", "--fabric_provider=tcp;ofi_rxm")
                 for ip in ("127.0.0.1", "127.0.0.2"))


@pytest.fixture
def agent_factory():
    started = []

    def start(*flags, dir="", wrap=()):
        started.append(Agent(*flags, dir=dir, wrap=wrap))
        return started[-1]

    yield start
    for a in started:
        if not a.killed:
            assert a.stop() == 0
