"""Per-peer state stays bounded with real agents: a peer agent that restarts leaves its
old connection retired, and once no op or transfer to it is left, the old connection
(address-vector entries, key caches, staging slots) is released."""
import socket
import time
import urllib.request

import ferry

FABRIC = ("--fabric_provider=tcp;ofi_rxm",)


def _peers(agent) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.ready()['metrics_port']}/metrics", timeout=5).read()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("ferry_peers{"):
            state = line.split('state="')[1].split('"')[0]
            out[state] = float(line.split()[1])
    return out


def write_soon(client, src, dst, seconds: float = 10.0) -> None:
    """One write, tried again while the restarted peer is unreachable (the old channel's
    reconnect backoff may still refuse the first handshake: that retires the old
    connection, and the next try connects afresh)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.write(src, dst, [(0, 0, 4096)]).result(30)
            return
        except ferry.Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_restarted_peers_old_connections_are_released_once_their_transfers_ended(agent_factory):
    with socket.socket() as s:  # the peer keeps its address across restarts, as a node does
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    a = agent_factory("--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1", *FABRIC)
    with ferry.Client(a.socket) as ca:
        src = ca.register_host(1 << 16)
        for incarnation in range(4):
            b = agent_factory(f"--peer_address=127.0.0.2:{port}", "--fabric_iface=127.0.0.2", *FABRIC)
            with ferry.Client(b.socket) as cb:
                dst = cb.register_host(1 << 16)
                write_soon(ca, src, dst.descriptor())
                for _ in range(3):
                    ca.write(src, dst.descriptor(), [(0, 0, 1 << 16)]).result(30)
            assert b.stop() == 0
    # Three restarts seen; each old connection goes once its last transfer and report ended.
    deadline = time.monotonic() + 10
    while _peers(a).get("draining", -1) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    peers = _peers(a)
    assert peers["retired"] == 3, peers
    assert peers["draining"] == 0, peers
