"""What one request's KV handoff costs to submit from Python: one ``write_batch`` (one
block mapping over every layer's K and V halves) against one ``write_blocks`` RPC per
layer half, and against a write queue's paged entries (the mapping written once into the
queue's block table, one entry per layer half, no RPC, no notification) and its batch
entry (the 64 parts and the mapping in the table, one entry, one notification, as
``write_batch``), node-local host memory on one agent, alternated over rounds (medians).
Shape: Llama-3-8B (32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks: 32 KiB
per block per K or V), ``--blocks`` blocks per request (256 = 4k tokens).
``--block_bytes=64`` keeps the request's shape but makes the copies negligible: the
submit then costs only the control path (no copy thread competing for a core).

    .venv/bin/python tools/bench/py_batch.py --ferryd=bazel-bin/agent/main/ferryd
"""
import argparse
import array
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


def queue_row(q, parts, block, src_ids, dst_ids):
    t0 = time.perf_counter()
    n = len(src_ids)
    q.table[0:n] = array.array("I", src_ids)
    q.table[n:2 * n] = array.array("I", dst_ids)
    for i, (src, _, src_base, dst_base) in enumerate(parts):
        q.post_paged(src, block, n, dst_index=i // 2, src_base=src_base, dst_base=dst_base, user_data=i)
    t1 = time.perf_counter()
    done = []
    while len(done) < len(parts):
        done += q.reap(max_count=len(parts), timeout=60.0, min_count=len(parts) - len(done))
    if any(c.error for c in done):
        raise next(c.error for c in done if c.error)
    return t1 - t0, time.perf_counter() - t0


def queue_batch_row(q, parts, block, src_ids, dst_ids):
    t0 = time.perf_counter()
    q.post_batch([(src, i // 2, src_base, dst_base) for i, (src, _, src_base, dst_base) in enumerate(parts)], block,
                 src_ids, dst_ids, notify=True, tag=1)
    t1 = time.perf_counter()
    (c,) = q.reap(max_count=1, timeout=60.0)
    if c.error:
        raise c.error
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
            q = producer.create_queue(descriptors, entries=2 * LAYERS, table_ids=2 * args.blocks)
            qb = producer.create_queue(descriptors, entries=8, table_ids=2 * LAYERS * 8 + 2 * args.blocks)
            rows = {"batch": [], "per_layer": [], "queue": [], "queue_batch": []}
            fns = {"batch": lambda *a: batch_row(producer, *a), "per_layer": lambda *a: per_layer_row(producer, *a),
                   "queue": lambda *a: queue_row(q, *a), "queue_batch": lambda *a: queue_batch_row(qb, *a)}
            batch_row(producer, parts, block, src_ids, dst_ids)  # warm-up (first touch of every page)
            queue_row(q, parts, block, src_ids, dst_ids)
            queue_batch_row(qb, parts, block, src_ids, dst_ids)
            for r in range(args.rounds):
                order = ("batch", "per_layer", "queue", "queue_batch")
                for kind in order[r % 4:] + order[:r % 4]:
                    rows[kind].append(fns[kind](parts, block, src_ids, dst_ids))
                    list(consumer.notifications(timeout=0.01))  # drain
            mb = 2 * LAYERS * half / 1e6
            print(f"# one request's KV handoff from Python, node-local host memory, {LAYERS} layers x K,V x "
                  f"{args.blocks} blocks of {block} B ({mb:.1f} MB); {args.rounds} rounds, medians; "
                  f"{os.cpu_count()} CPUs")
            print(f"{'api':>22} {'calls':>6} {'submit_ms':>10} {'handoff_ms':>11} {'GB/s':>6}")
            for kind, row, calls in (("write_batch", "batch", 1), ("write_blocks per half", "per_layer", 2 * LAYERS),
                                     ("queue post_paged", "queue", 0), ("queue post_batch", "queue_batch", 0)):
                v = rows[row]
                submit = statistics.median(x[0] for x in v) * 1e3
                total = statistics.median(x[1] for x in v) * 1e3
                print(f"{kind:>22} {calls:>6} {submit:>10.2f} {total:>11.2f} {mb / total:>6.2f}")


if __name__ == "__main__":
    sys.exit(main())
