"""What one request's KV handoff costs to submit from Python: one ``write_batch`` (one
block mapping over every layer's K and V halves) against one ``write_blocks`` RPC per
layer half, node-local host memory on one agent, alternated over rounds (medians).
Shape: Llama-3-8B (32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks: 32 KiB
per block per K or V), ``--blocks`` blocks per request (256 = 4k tokens).
``--block_bytes=64`` keeps the request's shape but makes the copies negligible: the
submit then costs only the control path (no copy thread competing for a core).

    .venv/bin/python tools/bench/py_batch.py --ferryd=bazel-bin/agent/main/ferryd
"""
import argparse
import os
import random
import statistics
import sys
import time

import ferry
from bench_agent import local_agent

LAYERS, LLAMA_BLOCK = 32, 16 * 8 * 128 * 2


def batch_row(producer, parts, block, src_ids, dst_ids):
    t0 = time.perf_counter()
    f = producer.write_batch(parts, block, src_ids, dst_ids, notify=True, tag=1)
    t1 = time.perf_counter()
    f.result(60)
    return t1 - t0, time.perf_counter() - t0


def per_layer_row(producer, parts, block, src_ids, dst_ids):
    t0 = time.perf_counter()
    futures = []
    for src, dst, base, _ in parts:
        ids = [base // block + i for i in src_ids], [base // block + i for i in dst_ids]
        futures.append(producer.write_blocks(src, dst, block, ids[0], ids[1], notify=True, tag=1))
    t1 = time.perf_counter()
    for f in futures:
        f.result(60)
    return t1 - t0, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--blocks", type=int, default=256, help="blocks per request (and per layer half)")
    p.add_argument("--block_bytes", type=int, default=LLAMA_BLOCK, help="bytes per block per K or V")
    args = p.parse_args()
    block = args.block_bytes
    half = args.blocks * block
    with local_agent(args.ferryd, "fy.pb.") as (sock, _):
        with ferry.Client(sock) as producer, ferry.Client(sock) as consumer:
            src = [producer.register_host(2 * half) for _ in range(LAYERS)]
            dst = [consumer.register_host(2 * half) for _ in range(LAYERS)]
            descriptors = [d.descriptor() for d in dst]
            parts = [(src[l], descriptors[l], base, base) for l in range(LAYERS) for base in (0, half)]
            src_ids = list(range(args.blocks))
            dst_ids = random.Random(1).sample(range(args.blocks), args.blocks)
            rows = {"batch": [], "per_layer": []}
            batch_row(producer, parts, block, src_ids, dst_ids)  # warm-up (first touch of every page)
            for r in range(args.rounds):
                for kind in (("batch", "per_layer") if r % 2 == 0 else ("per_layer", "batch")):
                    fn = batch_row if kind == "batch" else per_layer_row
                    rows[kind].append(fn(producer, parts, block, src_ids, dst_ids))
                    list(consumer.notifications(timeout=0.01))  # drain
            mb = 2 * LAYERS * half / 1e6
            print(f"# one request's KV handoff from Python, node-local host memory, {LAYERS} layers x K,V x "
                  f"{args.blocks} blocks of {block} B ({mb:.1f} MB); {args.rounds} rounds, medians; "
                  f"{os.cpu_count()} CPUs")
            print(f"{'api':>22} {'calls':>6} {'submit_ms':>10} {'handoff_ms':>11} {'GB/s':>6}")
            for kind, calls in (("write_batch", 1), ("write_blocks per half", 2 * LAYERS)):
                v = rows["batch" if calls == 1 else "per_layer"]
                submit = statistics.median(x[0] for x in v) * 1e3
                total = statistics.median(x[1] for x in v) * 1e3
                print(f"{kind:>22} {calls:>6} {submit:>10.2f} {total:>11.2f} {mb / total:>6.2f}")


if __name__ == "__main__":
    sys.exit(main())
