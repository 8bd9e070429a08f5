#!/usr/bin/env python3
"""FerryConnector's worker core (ferry.vllm.worker, no vLLM import) on a GPU host: CUDA KV
tensors in vLLM's layout, one per layer
([2, num_blocks, block_size, num_kv_heads, head_dim], bf16, from PyTorch's caching
allocator: registered through legacy IPC handles), handed from a producer process to a
consumer process — through one agent (node-local GPU copies), then through two agents
(libfabric tcp;ofi_rxm on loopback: the staged path) — and checked block for block; then
an MLA model's latent cache ([num_blocks, block_size, 576] per layer) through one agent.

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


def shape(mla):
    return (BLOCKS, BLOCK_TOKENS, LATENT) if mla else (2, BLOCKS, BLOCK_TOKENS, HEADS, DIM)


def block(t, b, mla):
    """Block `b` of one layer's tensor: its latent (MLA), or its K and V."""
    return t[b] if mla else t[:, b]


def cache(torch, device, seed, mla):
    """One tensor per layer, filled from `seed` (the consumer rebuilds the producer's to check)."""
    g = torch.Generator(device=f"cuda:{device}").manual_seed(seed)
    return [torch.randn(shape(mla), generator=g, device=f"cuda:{device}", dtype=torch.float32).to(torch.bfloat16)
            for _ in range(LAYERS)]


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
    layers = cache(torch, 0, args.seed, args.mla)
    w = FerryWorker(args.socket, "prefill", 0, producer=True, consumer=False, lease=60)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(layers)})
    reqs = requests(args.seed)
    w.apply(StepPlan(hold={rid: src for rid, src, _, _ in reqs}))
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
    layers = [torch.zeros(shape(args.mla), device="cuda:0", dtype=torch.bfloat16) for _ in range(LAYERS)]
    w = FerryWorker(args.socket, "decode", 0, producer=False, consumer=True, timeout=60)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(layers)})
    wait_for(f"{args.dir}/mailbox")
    mailbox = open(f"{args.dir}/mailbox", "rb").read()
    reqs = requests(args.seed)
    t0 = time.monotonic()
    w.apply(StepPlan(pull={rid: Pull(rid, [mailbox], dst, skip) for rid, _, dst, skip in reqs}))
    done, failed = run_worker(w, reqs, "finished_recving")
    elapsed = time.monotonic() - t0
    torch.cuda.synchronize()
    expect = cache(torch, 0, args.seed, args.mla)  # the producer's tensors, rebuilt
    bad = 0
    for rid, src, dst, skip in reqs:
        for layer in range(LAYERS):
            for s, d in zip(src[skip:], dst):
                if not torch.equal(block(layers[layer], d, args.mla).view(torch.int16),
                                   block(expect[layer], s, args.mla).view(torch.int16)):
                    bad += 1
    blocks = sum(len(d) for _, _, d, _ in reqs) * LAYERS * (1 if args.mla else 2)
    ok = done == {r[0] for r in reqs} and not failed and bad == 0
    print(f"consumer: {len(done)} of {len(reqs)} requests received, {len(failed)} failed, {blocks} blocks checked "
          f"({bad} wrong) in {elapsed * 1e3:.1f} ms", flush=True)
    open(f"{args.dir}/consumer-finished", "w").close()
    w.close()
    return 0 if ok else 1


def orchestrate(args):
    bin_dir = os.path.abspath(args.bin)
    results = []
    for case, two_agents, mla in (("one agent (node-local GPU copies)", False, False),
                                  ("two agents (staged, tcp;ofi_rxm)", True, False),
                                  ("MLA latent cache, one agent", False, True)):
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
            seed = 11 if two_agents else 13 if mla else 7
            me, flags = os.path.abspath(__file__), [f"--dir={work}", f"--seed={seed}"] + (["--mla"] if mla else [])
            prod = subprocess.Popen([sys.executable, me, "producer", f"--socket={work}/a.sock", *flags])
            cons = subprocess.Popen([sys.executable, me, "consumer", f"--socket={work}/{nodes[-1][0]}.sock", *flags])
            rc = [cons.wait(120), prod.wait(120)]
            results.append((case, rc == [0, 0]))
        finally:
            for a in agents:
                a.terminate()
                a.wait(15)
    for case, ok in results:
        print(f"{case}: {'PASS' if ok else 'FAIL'}")
    return 0 if all(ok for _, ok in results) else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["orchestrate", "producer", "consumer"], nargs="?", default="orchestrate")
    p.add_argument("--bin", default=".gpu-bundle/bin")
    p.add_argument("--socket")
    p.add_argument("--dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mla", action="store_true", help="an MLA model's latent cache instead of K and V")
    args = p.parse_args()
    return {"orchestrate": orchestrate, "producer": producer, "consumer": consumer}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
