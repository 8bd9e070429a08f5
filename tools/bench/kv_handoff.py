"""One request's KV handoff through FerryConnector's worker core, for tools/bench.sh kv.

Two FerryWorkers (ferry.vllm.worker, what vLLM's workers run) on two agents: the
producer holds a request's blocks (what its scheduler's request_finished plans), the
consumer pulls them into blocks of its own (what its update_state_after_alloc plans),
and both are polled as vLLM's model runner does each step. Timed: from the producer's
hold to the consumer reporting the request in finished_recving. Submit: the longest
producer step (the one that answered the pull with one write_batch over all layers).

    python kv_handoff.py --producer=A.sock --consumer=B.sock --tokens=1024,4096 --rounds=3

Prints "tokens bytes time_ms GBps submit_ms" per request (after one untimed request per
size), and with --device=cuda:N "raw_copy_ms" (one contiguous copy of the same bytes on
that GPU). Cache: Llama-3-8B-shaped, 32 layers of [2, blocks, 16, 8, 128] bf16, in host
memory or on the GPU.
"""
import argparse
import random
import time

import torch

import ferry.host
from ferry.vllm.scheduler import Pull, StepPlan
from ferry.vllm.worker import FerryWorker

LAYERS, BLOCK_TOKENS, KV_HEADS, HEAD = 32, 16, 8, 128


def caches(num_blocks, seed, device):
    """Host tensors from ferry.host.empty, or CUDA tensors from PyTorch's caching allocator (as vLLM's)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    shape = (2, num_blocks, BLOCK_TOKENS, KV_HEADS, HEAD)
    for i in range(LAYERS):
        t = ferry.host.empty(shape, torch.bfloat16) if device == "cpu" else \
            torch.empty(shape, dtype=torch.bfloat16, device=device)
        t.view(torch.int16).copy_(torch.randint(-30000, 30000, t.shape, generator=g, dtype=torch.int16, device=device))
        out[f"model.layers.{i}.self_attn.attn"] = t
    return out


def raw_copy_seconds(nbytes, device):
    """The GPU's lower bound: one contiguous copy of the same bytes (median of 5)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]


def handoff(producer, consumer, rid, src, dst, seconds=120.0):
    t0 = time.perf_counter()
    producer.apply(StepPlan(hold={rid: src}))
    consumer.apply(StepPlan(pull={rid: Pull(rid, [producer.mailbox], dst, 0)}))
    submit, received, sent = 0.0, None, False
    while received is None or not sent:
        s0 = time.perf_counter()
        r = producer.results()
        submit = max(submit, time.perf_counter() - s0)
        sent |= rid in r.finished_sending
        c = consumer.results()
        if c.failed_recving:
            raise RuntimeError(f"the handoff of {rid} failed")
        if rid in c.finished_recving:
            received = time.perf_counter()
        if time.perf_counter() - t0 > seconds:
            raise TimeoutError(f"{rid} did not land in {seconds} s")
        time.sleep(0.001)  # a step of a busy engine is longer; polling faster takes the agent's core
    return received - t0, submit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--producer", required=True)
    ap.add_argument("--consumer", required=True)
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu (ferry.host memory) or cuda:N (also prints raw_copy_ms)")
    args = ap.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    num_blocks = max(sizes) // BLOCK_TOKENS + 8
    pcache, ccache = caches(num_blocks, 1, args.device), caches(num_blocks, 2, args.device)
    producer = FerryWorker(args.producer, "bench-prefill", 0, producer=True, consumer=False, lease=300)
    consumer = FerryWorker(args.consumer, "bench-decode", 0, producer=False, consumer=True, timeout=300)
    producer.register_kv_caches(pcache)
    consumer.register_kv_caches(ccache)
    rng = random.Random(3)
    block_bytes = 2 * BLOCK_TOKENS * KV_HEADS * HEAD * 2 * LAYERS  # K and V, every layer
    for tokens in sizes:
        n = tokens // BLOCK_TOKENS
        for r in range(args.rounds + 1):
            src, dst = rng.sample(range(num_blocks), n), rng.sample(range(num_blocks), n)
            seconds, submit = handoff(producer, consumer, f"{tokens}-{r}", src, dst)
            layer = next(iter(pcache))
            assert torch.equal(ccache[layer][:, dst[-1]].view(torch.int16), pcache[layer][:, src[-1]].view(torch.int16)), \
                "a block differs"
            if r:  # the first request of a size warms up (page faults of fresh memory)
                raw = f" {raw_copy_seconds(n * block_bytes, args.device) * 1e3:.2f}" if args.device != "cpu" else ""
                print(tokens, n * block_bytes, f"{seconds * 1e3:.2f}", f"{n * block_bytes / seconds / 1e9:.3f}",
                      f"{submit * 1e3:.3f}{raw}", flush=True)
    producer.close()
    consumer.close()


if __name__ == "__main__":
    main()
