"""The Python client's side of ``tools/bench.sh control``: 8-byte round trips through
the local API, one line each, "<name> <p50_us> <p99_us>": Write + result() into a
region of this agent, into the receiver's (another agent), the same with a
notification, and the write queue to the receiver; with --echo_socket, first a bare
unary call to tools/bench/grpc_echo from grpcio (Python's own floor).

    .venv/bin/python tools/bench/py_control.py --socket=A.sock --descriptor=DIR/descriptor --iters=2000
"""
import argparse
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--descriptor", required=True, help="the receiver's descriptor (another agent's region)")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--echo_socket", help="a grpc_echo server's socket")
    args = p.parse_args()
    if args.echo_socket:
        with grpc.insecure_channel(f"unix:{args.echo_socket}") as channel:
            # EchoMessage{data: 8 bytes}, encoded by hand: no generated stubs needed.
            echo = channel.unary_unary("/ferry.bench.Echo/Echo", request_serializer=None, response_deserializer=None)
            message = b"\x0a\x08" + b"x" * 8
            measure("py_echo", args.iters, lambda: echo(message, timeout=10))
    remote = open(args.descriptor, "rb").read()
    with ferry.Client(args.socket) as c:
        src = c.register_host(4096)
        here = c.register_host(4096)
        measure("py_local", args.iters, lambda: c.write(src, here.descriptor(), [(0, 0, 8)]).result(10))
        measure("py_remote", args.iters, lambda: c.write(src, remote, [(0, 0, 8)]).result(10))
        measure("py_remote_notify", args.iters, lambda: c.write(src, remote, [(0, 0, 8)], notify=True).result(10))
        with c.create_queue([remote], entries=8) as q:
            def queue_round_trip():
                q.post(src, 8)
                for r in q.reap(timeout=10.0, min_count=1):
                    if r.error is not None:
                        raise r.error
            measure("py_queue_remote", args.iters, queue_round_trip)


if __name__ == "__main__":
    sys.exit(main())
