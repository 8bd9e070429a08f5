"""The Python client's two write paths on one agent, node-local host memory: a
``Client.write`` RPC per transfer vs ``WriteQueue.post``, 16 transfers in flight each,
alternated over rounds (medians), and the C++ client's queue (ferry_bench) as the
baseline in the same run.

    .venv/bin/python tools/bench/py_queue.py --ferryd=bazel-bin/agent/main/ferryd --ferry_bench=bazel-bin/tools/bench/ferry_bench
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import ferry
from bench_agent import local_agent, wait_for

WINDOW = 16


def rpc_row(c, src, dst, size, n):
    futures, t0 = [], time.monotonic()
    for i in range(n):
        futures.append(c.write(src, dst, [(0, 0, size)]))
        if len(futures) >= WINDOW:
            futures.pop(0).result(30)
    for f in futures:
        f.result(30)
    return (time.monotonic() - t0) / n


def queue_row(q, src, size, n):
    posted = done = 0
    t0 = time.monotonic()
    deadline = t0 + 60
    while done < n and time.monotonic() < deadline:
        while posted < n and posted - done < WINDOW:
            q.post(src, size, user_data=posted)
            posted += 1
        for r in q.reap(timeout=1.0, spin=0.001):
            if r.error is not None:
                raise r.error
            done += 1
    if done < n:
        raise TimeoutError(f"{done} of {n} completions in 60 s")
    return (time.monotonic() - t0) / n


def cpp_row(ferry_bench, sock, work, size, n):
    out = subprocess.run([ferry_bench, "send", f"--socket={sock}", f"--dir={work}", f"--sizes={size}",
                          f"--count={n}", f"--window={WINDOW}", "--api=queue"],
                         check=True, capture_output=True, text=True, timeout=120).stdout.split()
    return float(out[2]) / 1e6  # "size count time_us GBps"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--ferry_bench", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--count", type=int, default=20000, help="writes per queue row (RPC rows: a tenth)")
    args = p.parse_args()
    with local_agent(args.ferryd, "fy.pq.") as (sock, work):
        receiver = subprocess.Popen([args.ferry_bench, "receive", f"--socket={sock}", f"--dir={work}",
                                     f"--size={1 << 20}"])
        wait_for(f"{work}/descriptor")
        dst = open(f"{work}/descriptor", "rb").read()
        print(f"# Python client, node-local host writes, {WINDOW} in flight, {args.count} per queue row "
              f"({args.count // 10} per RPC row), "
              f"{args.rounds} rounds; medians; {os.cpu_count()} CPUs")
        print(f"{'size':>8} {'rpc_us':>8} {'queue_us':>9} {'c++queue_us':>12} {'rpc/queue':>10} {'py/c++':>8}")
        with ferry.Client(sock) as c:
            src = c.register_host(1 << 20)
            with c.create_queue([dst], entries=64) as q:
                for size in (4096, 65536):
                    rows = {"rpc": [], "queue": [], "cpp": []}
                    queue_row(q, src, size, 2 * WINDOW)  # warm-up
                    for r in range(args.rounds):
                        order = ("rpc", "queue", "cpp") if r % 2 == 0 else ("cpp", "queue", "rpc")
                        for kind in order:
                            if kind == "rpc":
                                rows[kind].append(rpc_row(c, src, dst, size, args.count // 10))
                            elif kind == "queue":
                                rows[kind].append(queue_row(q, src, size, args.count))
                            else:
                                rows[kind].append(cpp_row(args.ferry_bench, sock, work, size, args.count))
                    m = {k: statistics.median(v) * 1e6 for k, v in rows.items()}
                    print(f"{size:>8} {m['rpc']:>8.1f} {m['queue']:>9.1f} {m['cpp']:>12.1f} "
                          f"{m['rpc'] / m['queue']:>9.1f}x {m['queue'] / m['cpp']:>7.2f}x")
        receiver.kill()


if __name__ == "__main__":
    sys.exit(main())
