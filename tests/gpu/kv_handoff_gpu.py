#!/usr/bin/env python3
"""FerryConnector's worker core (ferry.vllm.worker, no vLLM import) on a GPU host: CUDA KV
tensors as vLLM allocates them, one per layer (bf16, from PyTorch's caching allocator:
registered through legacy IPC handles) — vLLM 0.26+ FlashAttention's packed K/V view
(num_blocks, heads, block_size, 2 * head_dim) and the older [2, num_blocks, block_size,
heads, head_dim] — handed from a producer process to a consumer process: through one agent
(node-local GPU copies), through two agents (libfabric tcp;ofi_rxm on loopback: the staged
path), an MLA model's latent cache ([num_blocks, block_size, 576] per layer), and with two
GPUs from GPU0 to GPU1 through one agent; every block checked. With two GPUs also a
4k-token handoff timed against a raw NVLink copy (cross_gpu_speed).

    python3 tests/gpu/kv_handoff_gpu.py --bin=.gpu-bundle/bin     # prints one line per case, "PASS"/"FAIL"

The agents come from a bundle (tests/gpu/bundle.sh); the Python client from PYTHONPATH.
Request sequences: those FerryConnector's schedulers planned in the CPU run with vLLM
(vllm_requests.json; 8 concurrent requests, and a partial prefix hit).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

LAYERS, BLOCKS, BLOCK_TOKENS, HEADS, DIM = 8, 256, 16, 8, 128
LATENT = 576  # MLA (DeepSeek): kv_lora_rank 512 + rope 64


def physical_shape(kind):
    """A layer's allocation: vLLM 0.26+ FlashAttention's packed K and V (its default LBNHC
    layout: blocks, tokens, heads, K|V), the older [2, blocks, ...], or MLA's latent."""
    return {"packed": (BLOCKS, BLOCK_TOKENS, HEADS, 2 * DIM), "split": (2, BLOCKS, BLOCK_TOKENS, HEADS, DIM),
            "mla": (BLOCKS, BLOCK_TOKENS, LATENT)}[kind]


def as_vllm_views(kind, tensors):
    """The tensors as vLLM hands them to the connector: packed K/V as its permuted view
    (num_blocks, heads, block_size, 2 * head_dim)."""
    return [t.permute(0, 2, 1, 3) for t in tensors] if kind == "packed" else tensors


def block(t, b):
    """Block `b` of one layer's tensor, as the bytes ferry moves (its K and V halves)."""
    from ferry.vllm.worker import layer_spec, physical_view

    spec, flat = layer_spec(t), physical_view(t)
    per = spec.block_bytes // t.element_size()
    half = spec.num_blocks * per
    return [flat[h * half + b * per:h * half + (b + 1) * per] for h in range(spec.halves)]


def cache(torch, device, seed, kind):
    """One tensor per layer, filled from `seed` (the consumer rebuilds the producer's to check)."""
    g = torch.Generator(device="cuda:0").manual_seed(seed)
    return as_vllm_views(kind, [
        torch.randn(physical_shape(kind), generator=g, device="cuda:0", dtype=torch.float32).to(torch.bfloat16)
        .to(f"cuda:{device}") for _ in range(LAYERS)])


def requests(seed):
    """(request id, producer block ids, consumer block ids, skip): the requests FerryConnector's
    schedulers planned in the CPU run with vLLM (vllm_requests.json, recorded by
    client/python/tests/vllm with FERRY_RECORD_REQUESTS), the producer's ids shifted by
    ``seed`` so the two cases move different blocks."""
    import json

    recorded = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_requests.json")))
    out = []
    for test, reqs in sorted(recorded.items()):
        for i, r in enumerate(reqs):
            out.append((f"{test[:24]}-{i}", [(b + seed) % BLOCKS for b in r["src"]], r["dst"], r["skip"]))
    return out


def steps(reqs):
    """The requests in steps whose destination blocks are disjoint, in order: vLLM never
    gives a block to two requests at once (the recordings come from separate tests, and a
    partial prefix hit refills a block its first request had freed), and two open write
    windows over one block are refused."""
    out = []
    for r in reqs:
        if not out or set(r[2]) & {b for q in out[-1] for b in q[2]}:
            out.append([])
        out[-1].append(r)
    return out


def secret(rid):
    """A request's secret, the same in both processes (the script plays the params' trip)."""
    import hashlib

    return hashlib.sha256(rid.encode()).digest()[:16]


def wait_for(path, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


def plans():
    from ferry.vllm.scheduler import Pull, StepPlan

    return Pull, StepPlan


def run_worker(worker, reqs, key, seconds=60.0):
    """Steps ``worker`` as vLLM's model runner does until every request is in ``key``."""
    done, failed = set(), set()
    deadline = time.monotonic() + seconds
    while len(done) + len(failed) < len(reqs) and time.monotonic() < deadline:
        r = worker.results()
        done |= getattr(r, key)
        failed |= r.failed_recving
        time.sleep(0.001)
    return done - failed, failed


def producer(args):
    import torch
    from ferry.vllm.worker import FerryWorker

    Pull, StepPlan = plans()
    layers = cache(torch, 0, args.seed, args.kind)
    w = FerryWorker(args.socket, "prefill", 0, producer=True, consumer=False, lease=60)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(layers)})
    reqs = requests(args.seed)
    w.apply(StepPlan(hold={rid: src for rid, src, _, _ in reqs}, secrets={r[0]: secret(r[0]) for r in reqs}))
    with open(f"{args.dir}/mailbox.tmp", "wb") as f:
        f.write(w.mailbox)
    os.rename(f"{args.dir}/mailbox.tmp", f"{args.dir}/mailbox")
    done, failed = run_worker(w, reqs, "finished_sending")
    print(f"producer: {len(done)} requests sent", flush=True)
    wait_for(f"{args.dir}/consumer-finished", 60)  # keep the memory registered until checked
    w.close()
    return 0 if len(done) == len(reqs) else 1


def consumer(args):
    import torch
    from ferry.vllm.worker import FerryWorker

    Pull, StepPlan = plans()
    layers = as_vllm_views(args.kind, [torch.zeros(physical_shape(args.kind), device=f"cuda:{args.device}",
                                                   dtype=torch.bfloat16) for _ in range(LAYERS)])
    # The caches in window mode: each pull's blocks open to the producer alone.
    w = FerryWorker(args.socket, "decode", 0, producer=False, consumer=True, timeout=60, write_windows=True)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(layers)})
    wait_for(f"{args.dir}/mailbox")
    mailbox = open(f"{args.dir}/mailbox", "rb").read()
    reqs = requests(args.seed)
    t0 = time.monotonic()
    done, failed = set(), set()
    for step in steps(reqs):
        w.apply(StepPlan(pull={rid: Pull(rid, [mailbox], dst, skip, secret(rid)) for rid, _, dst, skip in step}))
        d, f = run_worker(w, step, "finished_recving")
        done, failed = done | d, failed | f
    elapsed = time.monotonic() - t0
    torch.cuda.synchronize()
    expect = cache(torch, args.device, args.seed, args.kind)  # the producer's tensors, rebuilt
    bad = 0
    for rid, src, dst, skip in reqs:
        for layer in range(LAYERS):
            for s, d in zip(src[skip:], dst):
                if not all(torch.equal(got.view(torch.int16), want.view(torch.int16))
                           for got, want in zip(block(layers[layer], d), block(expect[layer], s))):
                    bad += 1
    blocks = sum(len(d) for _, _, d, _ in reqs) * LAYERS
    ok = done == {r[0] for r in reqs} and not failed and bad == 0
    print(f"consumer: {len(done)} of {len(reqs)} requests received, {len(failed)} failed, {blocks} blocks checked "
          f"({bad} wrong) in {elapsed * 1e3:.1f} ms", flush=True)
    open(f"{args.dir}/consumer-finished", "w").close()
    w.close()
    return 0 if ok else 1


def orchestrate(args):
    bin_dir = os.path.abspath(args.bin)
    results = []
    import torch

    cases = [("one agent (node-local GPU copies), [2, blocks, ...]", False, "split", 0),
             ("one agent, vLLM's packed K/V view", False, "packed", 0),
             ("two agents (staged, tcp;ofi_rxm)", True, "split", 0),
             ("MLA latent cache, one agent", False, "mla", 0)]
    gpus = torch.cuda.device_count()
    if gpus >= 2:
        cases.append(("GPU0 -> GPU1, one agent (NVLink), vLLM's packed K/V view", False, "packed", 1))
    for case, two_agents, kind, device in cases:
        work = tempfile.mkdtemp(prefix="fy.kvg.", dir="/tmp")
        agents = []
        try:
            nodes = [("a", "127.0.0.1"), ("b", "127.0.0.2")] if two_agents else [("a", "127.0.0.1")]
            for name, addr in nodes:
                agents.append(subprocess.Popen(
                    [f"{bin_dir}/ferryd", f"--socket={work}/{name}.sock", "--metrics_address=127.0.0.1:0",
                     f"--peer_address={addr}:0", f"--fabric_iface={addr}", "--fabric_provider=tcp;ofi_rxm",
                     f"--ready_file={work}/{name}.ready", "--log_level=warning"],
                    env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(os.path.dirname(bin_dir), "lib"))))
            for name, _ in nodes:
                wait_for(f"{work}/{name}.ready")
            seed = 11 if two_agents else 13 if kind == "mla" else 7
            me, flags = os.path.abspath(__file__), [f"--dir={work}", f"--seed={seed}", f"--kind={kind}"]
            prod = subprocess.Popen([sys.executable, me, "producer", f"--socket={work}/a.sock", *flags])
            cons = subprocess.Popen([sys.executable, me, "consumer", f"--socket={work}/{nodes[-1][0]}.sock",
                                     f"--device={device}", *flags])
            rc = [cons.wait(120), prod.wait(120)]
            results.append((case, rc == [0, 0]))
        finally:
            for a in agents:
                a.terminate()
                a.wait(15)
    if gpus >= 2:
        results.append(cross_gpu_speed(bin_dir))
    for case, ok in results:
        print(f"{case}: {'PASS' if ok else 'FAIL'}")
    return 0 if all(ok for _, ok in results) else 1


def cross_gpu_speed(bin_dir, most=4.0):
    """A 4k-token Llama-3-8B-shaped request (512 MiB) from GPU0 to GPU1 through one agent
    (tools/bench/kv_handoff.py, two processes): PASS if its median time is within `most`
    times a raw peer copy of the same bytes measured in the same run. Copied a chunk at a
    time by the copy engines it took ~180 times that."""
    case = f"GPU0 -> GPU1 4k-token handoff within {most:g} x a raw NVLink copy"
    work = tempfile.mkdtemp(prefix="fy.kvs.", dir="/tmp")
    agent = subprocess.Popen([f"{bin_dir}/ferryd", f"--socket={work}/a.sock", "--metrics_address=127.0.0.1:0",
                              "--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1", "--fabric_provider=tcp;ofi_rxm",
                              f"--ready_file={work}/a.ready", "--log_level=warning"],
                             env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(os.path.dirname(bin_dir), "lib")))
    try:
        wait_for(f"{work}/a.ready")
        bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools/bench/kv_handoff.py")
        out = subprocess.run([sys.executable, bench, f"--producer={work}/a.sock", f"--consumer={work}/a.sock",
                              "--tokens=4096", "--rounds=5", "--device=cuda:0", "--consumer_device=cuda:1",
                              "--two_processes", "--step_ms=0.1"], capture_output=True, text=True, timeout=300)
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith("4096 ")]
        if out.returncode != 0 or not rows:
            print(f"{case}: the bench failed: {out.stderr[-2000:]}", flush=True)
            return case, False
        took = sorted(float(r[2]) for r in rows)[len(rows) // 2]
        raw = sorted(float(r[5]) for r in rows)[len(rows) // 2]
        print(f"{case}: median {took:.2f} ms, raw peer copy {raw:.2f} ms ({took / raw:.2f} x)", flush=True)
        return case, took <= most * raw
    finally:
        agent.terminate()
        agent.wait(15)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["orchestrate", "producer", "consumer"], nargs="?", default="orchestrate")
    p.add_argument("--bin", default=".gpu-bundle/bin")
    p.add_argument("--socket")
    p.add_argument("--dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kind", choices=["packed", "split", "mla"], default="packed",
                   help="the cache's layout (physical_shape)")
    p.add_argument("--device", type=int, default=0, help="consumer: the GPU its cache is on")
    args = p.parse_args()
    return {"orchestrate": orchestrate, "producer": producer, "consumer": consumer}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
