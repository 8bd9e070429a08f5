"""The Python client's side of ``tools/bench.sh control``: 8-byte round trips through
the local API, one line each, "<name> <p50_us> <p99_us>": status(), write(wait=) +
result() (one call, as the C++ client's WriteAndWait) into a
region of this agent, into the receiver's (another agent), the same with a
notification, and the write queue to the receiver; with --echo_socket, first a bare
unary call to tools/bench/grpc_echo from grpcio (Python's own floor). Last, a notified
8-byte write through the write queue timed from the post until the receiving session's
inbox (a second session, waiting in inbox.poll) has its notification: into a region of
this agent, and with --peer_socket into one of that agent's. With --rpc_lib, the RPC
rows again with the client's unary calls through libferry_rpc (py_native_*).

    .venv/bin/python tools/bench/py_control.py --socket=A.sock --descriptor=DIR/descriptor --iters=2000
"""
import argparse
import os
import sys
import time

import grpc

import ferry


def measure(name, iters, op):
    us = []
    for i in range(iters + 10):
        t0 = time.perf_counter()
        op()
        if i >= 10:
            us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    print(f"{name} {us[len(us) // 2]:.1f} {us[len(us) * 99 // 100]:.1f}", flush=True)


def measure_notified(name, iters, sender, src, receiver_socket):
    """Post -> the receiver's inbox has the notification (the sender's completion is
    reaped after the clock stops)."""
    with ferry.Client(receiver_socket) as r:
        dst = r.register_host(4096)
        inbox = r.open_inbox()
        with sender.create_queue([dst.descriptor()], entries=8) as q:
            def op():
                t0 = time.perf_counter()
                q.post(src, 8, notify=True)
                while not any(n.kind == "write" for n in inbox.poll(timeout=10.0)):
                    pass
                seconds = time.perf_counter() - t0
                for c in q.reap(timeout=10.0, min_count=1):
                    if c.error is not None:
                        raise c.error
                return seconds
            us = sorted([op() * 1e6 for _ in range(iters + 10)][10:])  # the first 10 warm up
    print(f"{name} {us[len(us) // 2]:.1f} {us[len(us) * 99 // 100]:.1f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--descriptor", required=True, help="the receiver's descriptor (another agent's region)")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--echo_socket", help="a grpc_echo server's socket")
    p.add_argument("--peer_socket", help="another agent's socket, for a cross-agent notified row")
    p.add_argument("--rpc_lib", help="libferry_rpc.so: the RPC rows again with the client's unary calls through it "
                                     "(rows py_native_*)")
    args = p.parse_args()
    if args.echo_socket:
        with grpc.insecure_channel(f"unix:{args.echo_socket}") as channel:
            # EchoMessage{data: 8 bytes}, encoded by hand: no generated stubs needed.
            echo = channel.unary_unary("/ferry.bench.Echo/Echo", request_serializer=None, response_deserializer=None)
            message = b"\x0a\x08" + b"x" * 8
            measure("py_echo", args.iters, lambda: echo(message, timeout=10))
    remote = open(args.descriptor, "rb").read()
    for prefix, rpc_lib in [("py", "")] + ([("py_native", args.rpc_lib)] if args.rpc_lib else []):
        with ferry.Client(args.socket, rpc_lib=rpc_lib) as c:
            src = c.register_host(4096)
            here = c.register_host(4096)
            measure(f"{prefix}_getstatus", args.iters, c.status)
            measure(f"{prefix}_local", args.iters,
                    lambda: c.write(src, here.descriptor(), [(0, 0, 8)], wait=10).result(10))
            measure(f"{prefix}_remote", args.iters, lambda: c.write(src, remote, [(0, 0, 8)], wait=10).result(10))
            measure(f"{prefix}_remote_notify", args.iters,
                    lambda: c.write(src, remote, [(0, 0, 8)], notify=True, wait=10).result(10))
    with ferry.Client(args.socket) as c:
        src = c.register_host(4096)
        # Polls the ring 1 ms before sleeping where this process may run on 2+ CPUs, else
        # sleeps at once: ferry_bench's rule for the C++ row (--reap_spin_us=-1).
        spin = 0.001 if len(os.sched_getaffinity(0)) >= 2 else 0.0
        with c.create_queue([remote], entries=8) as q:
            def queue_round_trip():
                q.post(src, 8)
                for r in q.reap(timeout=10.0, min_count=1, spin=spin):
                    if r.error is not None:
                        raise r.error
            measure("py_queue_remote", args.iters, queue_round_trip)
        measure_notified("py_notify_inbox_local", args.iters, c, src, args.socket)
        if args.peer_socket:
            measure_notified("py_notify_inbox_remote", args.iters, c, src, args.peer_socket)


if __name__ == "__main__":
    sys.exit(main())
