"""Two "nodes" for the connector's tests: two ferryd agents in network namespaces joined
by a veth pair where this machine allows it (root and iproute2, as in tools/demo.sh),
else on 127.0.0.1 and 127.0.0.2. Test traffic stays on this machine."""
import os
import shutil
import subprocess
import sys

import pytest


def _ip(*args) -> bool:
    return subprocess.run(["ip", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


@pytest.fixture
def node_agents(agent_factory):
    tag = f"fyv{os.getpid() % 100000}"
    names = (f"{tag}a", f"{tag}b")
    addrs = ("169.254.91.1", "169.254.91.2")
    made = os.geteuid() == 0 and shutil.which("ip") and _ip("netns", "add", names[0]) and \
        _ip("netns", "add", names[1]) and \
        _ip("link", "add", f"{tag}a", "netns", names[0], "type", "veth", "peer", "name", f"{tag}b", "netns", names[1])
    if made:
        for ns, addr in zip(names, addrs, strict=False):
            assert _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", ns) and _ip("-n", ns, "link", "set", ns, "up") \
                and _ip("-n", ns, "link", "set", "lo", "up")
        agents = tuple(agent_factory(f"--peer_address={addr}:0", f"--fabric_iface={addr}",
                                     "--fabric_provider=tcp;ofi_rxm", wrap=("ip", "netns", "exec", ns))
                       for ns, addr in zip(names, addrs, strict=False))
    else:
        for ns in names:
            _ip("netns", "del", ns)
        print("nodes: loopback addresses (network namespaces unavailable here)", file=sys.stderr)
        agents = tuple(agent_factory(f"--peer_address={ip}:0", f"--fabric_iface={ip}", "--fabric_provider=tcp;ofi_rxm")
                       for ip in ("127.0.0.1", "127.0.0.2"))
    yield agents
    for ns in names:
        _ip("netns", "del", ns)
