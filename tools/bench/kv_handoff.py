"""One request's KV handoff through FerryConnector's worker core, for tools/bench.sh kv.

Two FerryWorkers (ferry.vllm.worker, what vLLM's workers run) on two agents: the
producer holds a request's blocks (what its scheduler's request_finished plans), the
consumer pulls them into blocks of its own (what its update_state_after_alloc plans),
and both are polled as vLLM's model runner does each step (every --step_ms, default 1).
Timed: from the producer's hold to the consumer reporting the request in
finished_recving. Submit: the producer's time answering the pull (checking it and
posting one batch entry, or a write_batch, over all layers), on whichever thread
answered it (the producer's responder, or its poll).

    python kv_handoff.py --producer=A.sock --consumer=B.sock --tokens=1024,4096 --rounds=3

With --concurrent=N, N requests of a size at once instead (held in one producer step,
pulled in one consumer step, as an engine's step finishes and schedules several), timed
until the last is in finished_recving: a throughput row beside the single request's
latency. Prints "tokens bytes time_ms GBps submit_ms" per request, or per N requests
(bytes and submit their totals), after one untimed round per size; with --device=cuda:N
also "raw_copy_ms" (one contiguous copy of the same bytes on that GPU, or to the
consumer's with --consumer_device=cuda:M: the two GPUs' link), with --raw_blocks
also "raw_blocks_ms" (the request's blocks moved by PyTorch in one process: per layer,
one gather and one scatter by block ids), and with --phases when the pull was sent, was
read by the producer, was answered (the batch posted), the producer saw its write
complete, and the consumer's notification arrived, in ms after the hold. By default
both workers live in this process (their threads share one GIL); --two_processes puts
the consumer in a process of its own, as a deployment's decode pod is, told to pull
over a pipe right after the hold. With --loads (needs --two_processes and a GPU) each
size is timed under each load in turn: idle, or a third process running bf16 matmuls
back to back on the producer's GPU (`producer`) or the consumer's (`consumer`), as a
serving engine's forward passes would; one row per load and size: p50 / p99 / max of
the rounds, the raw copy measured under the same load, and the matmul process's rate
alone and while the handoffs ran (what the handoffs cost the model). Cache:
Llama-3-8B-shaped, 32 layers of [2, blocks, 16, 8, 128] bf16, in host memory or on the GPU.
"""
import argparse
import hashlib
import math
import multiprocessing
import random
import time

import torch

import ferry.host
from ferry.vllm.scheduler import Pull, StepPlan
from ferry.vllm.worker import FerryWorker

LAYERS, BLOCK_TOKENS, KV_HEADS, HEAD = 32, 16, 8, 128
BLOCK_BYTES = 2 * BLOCK_TOKENS * KV_HEADS * HEAD * 2 * LAYERS  # one block's K and V, every layer


def secret(rid):
    """A request's secret, the same in both processes (the bench plays the params' trip)."""
    return hashlib.sha256(rid.encode()).digest()[:16]


def caches(num_blocks, seed, device, layers=LAYERS):
    """Host tensors from ferry.host.empty, or CUDA tensors from PyTorch's caching allocator
    (as vLLM's); the first `layers` of them (the same for a seed, whatever `layers`)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    shape = (2, num_blocks, BLOCK_TOKENS, KV_HEADS, HEAD)
    for i in range(layers):
        t = ferry.host.empty(shape, torch.bfloat16) if device == "cpu" else \
            torch.empty(shape, dtype=torch.bfloat16, device=device)
        t.view(torch.int16).copy_(torch.randint(-30000, 30000, t.shape, generator=g, dtype=torch.int16, device=device))
        out[f"model.layers.{i}.self_attn.attn"] = t
    return out


def raw_blocks_seconds(pcache, ccache, src, dst, device):
    """The request's scattered blocks moved by PyTorch within one process (median of 5):
    ``d[:, dst] = s[:, src]`` for every layer, the copy alone, no handoff around it. It
    writes the bytes the handoff already wrote."""
    si = torch.tensor(src, device=device)
    di = torch.tensor(dst, device=device)
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for name, s in pcache.items():
            ccache[name][:, di] = s[:, si]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]


def raw_copy_seconds(nbytes, device, dst_device=None):
    """The GPUs' lower bound: one contiguous copy of the same bytes (median of 5), on one
    GPU or from `device` to `dst_device` (a peer copy, over NVLink where there is one)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_device or device)
    times = []
    for _ in range(6):
        for d in {src.device, dst.device}:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(dst.device)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]


class Timeline:
    """--phases: when each step of one handoff happened, by wrapping the worker core's
    pieces from outside (no timer in ferry's code): the consumer's pull sent, the pull
    read by the producer's poll, the batch posted, the producer's step that saw its write
    complete, the consumer's notification read by its poll."""

    def __init__(self, producer, consumer):
        self.marks = {}
        self._stamp_inbox(producer.producer._inbox, "pull_at_producer")
        self._stamp_inbox(consumer.consumer._inbox, "notified_consumer")
        kvp = producer.producer
        write = kvp._write

        def timed_write(accepted, progress):
            write(accepted, progress)
            if accepted:
                self.marks["posted"] = time.perf_counter()
        kvp._write = timed_write

    def _stamp_inbox(self, inbox, name):
        drain = inbox.drain

        def stamped():
            got = drain()
            if got:
                self.marks.setdefault(name, time.perf_counter())
            return got
        inbox.drain = stamped

    def start(self):
        self.marks = {}
        return time.perf_counter()


PHASES = ("pull_sent", "pull_at_producer", "posted", "written", "notified_consumer")


class PullTimer:
    """Times the producer's answers to pulls (its _on_pull, which checks one, and its
    _write, which posts those read together; wrapped from outside)."""

    def __init__(self, producer):
        self.seconds = 0.0
        kvp = producer.producer
        for name in ("_on_pull", "_write"):
            setattr(kvp, name, self._timed(getattr(kvp, name)))

    def _timed(self, method):
        def timed(*a, **k):
            t = time.perf_counter()
            method(*a, **k)
            self.seconds += time.perf_counter() - t
        return timed


def handoff(producer, consumer, requests, step, pulls, timeline=None, seconds=120.0):
    """Hands off `requests` ([(request id, producer's block ids, consumer's block ids)])
    at once; returns the seconds until the consumer reported the last, the producer's
    time answering pulls, and (with a timeline, one request) the phases."""
    pulls.seconds = 0.0
    t0 = timeline.start() if timeline else time.perf_counter()
    producer.apply(StepPlan(hold={rid: src for rid, src, _ in requests}, secrets={r: secret(r) for r, _, _ in requests}))
    consumer.apply(StepPlan(pull={rid: Pull(rid, [producer.mailbox], dst, 0, secret(rid)) for rid, _, dst in requests}))
    if timeline:
        timeline.marks["pull_sent"] = time.perf_counter()
    receiving, sending = {rid for rid, _, _ in requests}, {rid for rid, _, _ in requests}
    while receiving or sending:
        sending -= producer.results().finished_sending
        if not sending and timeline:
            timeline.marks.setdefault("written", time.perf_counter())
        c = consumer.results()
        if c.failed_recving:
            raise RuntimeError(f"the handoff of {sorted(c.failed_recving)} failed")
        if receiving and not receiving - c.finished_recving:
            received = time.perf_counter()
        receiving -= c.finished_recving
        if time.perf_counter() - t0 > seconds:
            raise TimeoutError(f"{sorted(receiving | sending)} did not land in {seconds} s")
        time.sleep(step)  # a step of a busy engine is longer; polling faster takes the agent's core
    phases = [(timeline.marks.get(p, float("nan")) - t0) * 1e3 for p in PHASES] if timeline else []
    return received - t0, pulls.seconds, phases


def handoff_to_process(producer, conn, requests, step, pulls, seconds=120.0):
    """handoff() with the consumer in a process of its own (consumer_process): it is told
    the requests beforehand and to pull them right after the hold (the proxy's hop: one
    message on a pipe); returns the seconds until it reported the last, and the producer's
    time answering pulls."""
    pulls.seconds = 0.0
    conn.send(requests)
    t0 = time.perf_counter()
    producer.apply(StepPlan(hold={rid: src for rid, src, _ in requests}, secrets={r: secret(r) for r, _, _ in requests}))
    conn.send_bytes(b"pull")
    sending = {rid for rid, _, _ in requests}
    while sending:
        sending -= producer.results().finished_sending
        if time.perf_counter() - t0 > seconds:
            raise TimeoutError(f"{sorted(sending)} were not sent in {seconds} s")
        time.sleep(step)
    received, wrong = conn.recv()
    if wrong:
        raise RuntimeError(wrong)
    return received - t0, pulls.seconds


def consumer_process(args, num_blocks, conn, seconds=120.0):
    """--two_processes: the decode side alone in a process (as a deployment's decode pod,
    with its own GIL), stepped every --step_ms as handoff() steps it. Answers each round
    with when the last request was in finished_recving (perf_counter: CLOCK_MONOTONIC,
    one clock for both processes) and what was wrong, if anything."""
    ccache = caches(num_blocks, 2, args.consumer_device)
    expect = next(iter(caches(num_blocks, 1, args.device, layers=1).values())).to(args.consumer_device)
    layer = next(iter(ccache))
    consumer = FerryWorker(args.consumer, "bench-decode", 0, producer=False, consumer=True, timeout=300,
                           write_windows=args.write_windows)
    consumer.register_kv_caches(ccache)
    mailbox = conn.recv()
    conn.send("ready")
    step = args.step_ms / 1e3
    while (requests := conn.recv()) is not None:
        conn.recv_bytes()  # the producer holds them now
        t0 = time.perf_counter()
        consumer.apply(StepPlan(pull={rid: Pull(rid, [mailbox], dst, 0, secret(rid)) for rid, _, dst in requests}))
        receiving, wrong = {rid for rid, _, _ in requests}, ""
        while receiving and not wrong:
            c = consumer.results()
            if c.failed_recving:
                wrong = f"the handoff of {sorted(c.failed_recving)} failed"
            if receiving and not receiving - c.finished_recving:
                received = time.perf_counter()
            receiving -= c.finished_recving
            if time.perf_counter() - t0 > seconds:
                wrong = f"{sorted(receiving)} did not land in {seconds} s"
            time.sleep(step)
        if not wrong and not all(torch.equal(ccache[layer][:, d[-1]].view(torch.int16), expect[:, s[-1]].view(torch.int16))
                                 for _, s, d in requests):
            wrong = "a block differs"
        conn.send((received if not wrong else 0.0, wrong))
    consumer.close()


def busy_process(device, conn, size=8192):
    """--loads: bf16 matmuls back to back on `device` until told to stop. Answers
    "sample" with (matmuls done, perf_counter) and "stop" by exiting."""
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    conn.send("ready")
    done = 0
    while True:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize(device)
        done += 8
        while conn.poll():
            if conn.recv() == "stop":
                return
            conn.send((done, time.perf_counter()))


class Busy:
    """A busy_process on `device` (None: no load), with its matmul rate in TFLOPS between
    two samples."""
    FLOPS = 2 * 8192 ** 3

    def __init__(self, device):
        self.conn = self.child = None
        if device is None:
            return
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.child = ctx.Process(target=busy_process, args=(device, theirs))
        self.child.start()
        if self.conn.recv() != "ready":
            raise RuntimeError("the matmul process did not start")

    def sample(self):
        if self.child is None:
            return None
        self.conn.send("sample")
        return self.conn.recv()

    def tflops(self, first, last):
        if first is None:
            return float("nan")
        return (last[0] - first[0]) * self.FLOPS / (last[1] - first[1]) / 1e12

    def stop(self):
        if self.child is not None:
            self.conn.send("stop")
            self.child.join(30)


def percentile(values, q):
    """The nearest-rank percentile: the smallest value with at least q of them at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--producer", required=True)
    ap.add_argument("--consumer", required=True)
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--write_windows", type=int, default=0,
                    help="1: the consumer's caches in window mode, a window per request (FerryConnector's "
                         "write_windows)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--device", default="cpu",
                    help="cpu (ferry.host memory) or cuda:N (also prints raw_copy_ms)")
    ap.add_argument("--consumer_device", default=None,
                    help="the consumer's cache on another GPU (cuda:M; default: --device); raw_copy_ms is then a "
                         "peer copy from --device")
    ap.add_argument("--raw_blocks", action="store_true",
                    help="with cuda:N, also the blocks moved by PyTorch indexing (raw_blocks_ms)")
    ap.add_argument("--step_ms", type=float, default=1.0,
                    help="pause between two polls of both workers (a model runner's step); 0 polls back to back")
    ap.add_argument("--phases", action="store_true",
                    help="also print when each step happened, ms after the hold: " + ", ".join(PHASES))
    ap.add_argument("--concurrent", type=int, default=1,
                    help="requests handed off at once, timed together (each side's cache holds them all)")
    ap.add_argument("--two_processes", action="store_true",
                    help="the consumer in a process of its own, as in a deployment (default: both in this one, "
                         "sharing its GIL)")
    ap.add_argument("--loads", default=None,
                    help="with --two_processes on GPUs: comma-separated loads to time each size under (idle, "
                         "producer, consumer: a matmul process on that side's GPU); prints p50 / p99 rows")
    args = ap.parse_args()
    args.consumer_device = args.consumer_device or args.device
    if (args.device == "cpu") != (args.consumer_device == "cpu"):
        ap.error("--device and --consumer_device must both be cpu or both cuda:N")
    if args.raw_blocks and args.consumer_device != args.device:
        ap.error("--raw_blocks needs both caches on one device")
    if args.concurrent < 1 or (args.phases and args.concurrent > 1):
        ap.error("--concurrent must be 1 or more, and 1 with --phases")
    if args.two_processes and (args.phases or args.raw_blocks):
        ap.error("--phases and --raw_blocks need both sides in one process")
    loads = args.loads.split(",") if args.loads else [None]
    if args.loads and (not args.two_processes or args.device == "cpu" or args.concurrent > 1 or
                       set(loads) - {"idle", "producer", "consumer"}):
        ap.error("--loads needs --two_processes, cuda:N, one request at a time, and loads among idle, producer, "
                 "consumer")
    sizes = [int(t) for t in args.tokens.split(",")]
    num_blocks = args.concurrent * max(sizes) // BLOCK_TOKENS + 8
    if args.two_processes:  # started before this process touches a GPU
        conn, theirs = multiprocessing.get_context("spawn").Pipe()
        child = multiprocessing.get_context("spawn").Process(target=consumer_process, args=(args, num_blocks, theirs))
        child.start()
    pcache = caches(num_blocks, 1, args.device)
    producer = FerryWorker(args.producer, "bench-prefill", 0, producer=True, consumer=False, lease=300)
    producer.register_kv_caches(pcache)
    if args.two_processes:
        conn.send(producer.mailbox)
        conn.recv()  # ready
    else:
        ccache = caches(num_blocks, 2, args.consumer_device)
        consumer = FerryWorker(args.consumer, "bench-decode", 0, producer=False, consumer=True, timeout=300,
                               write_windows=args.write_windows)
        consumer.register_kv_caches(ccache)
    timeline = Timeline(producer, consumer) if args.phases else None
    pulls = PullTimer(producer)
    rng = random.Random(3)
    if args.loads:
        print("# load tokens rounds p50_ms p99_ms max_ms raw_copy_ms matmul_TFLOPS_alone matmul_TFLOPS_beside")
    sides = (producer, conn if args.two_processes else consumer, pcache, None if args.two_processes else ccache)
    for load in loads:
        busy = Busy({"producer": args.device, "consumer": args.consumer_device}.get(load))
        alone = busy.sample()
        if alone is not None:
            time.sleep(2)
        before = busy.sample()
        for tokens in sizes:
            times = timed_size(args, tokens, sides, pulls, timeline, rng, num_blocks, print_rounds=load is None)
            if load is None:
                continue
            after = busy.sample()
            raw = raw_copy_seconds(tokens // BLOCK_TOKENS * BLOCK_BYTES, args.device, args.consumer_device)
            print(load, tokens, len(times), *(f"{percentile(times, q) * 1e3:.2f}" for q in (0.5, 0.99, 1.0)),
                  f"{raw * 1e3:.2f}", f"{busy.tflops(alone, before):.0f}", f"{busy.tflops(before, after):.0f}",
                  flush=True)
            before = busy.sample()
        busy.stop()
    producer.close()
    if args.two_processes:
        conn.send(None)
        child.join(30)
    else:
        consumer.close()


def timed_size(args, tokens, sides, pulls, timeline, rng, num_blocks, print_rounds):
    """Hands off `tokens`-token requests for 1 + --rounds rounds (the first warms up: page
    faults of fresh memory) and returns the timed rounds' seconds; prints a row per timed
    round with `print_rounds`. `sides`: the producer, the consumer (or the pipe to its
    process), and their caches (the consumer's None in its own process)."""
    producer, consumer, pcache, ccache = sides
    n = tokens // BLOCK_TOKENS
    total = args.concurrent * n * BLOCK_BYTES
    times = []
    for r in range(args.rounds + 1):
        src = rng.sample(range(num_blocks), args.concurrent * n)
        dst = rng.sample(range(num_blocks), args.concurrent * n)
        requests = [(f"{tokens}-{r}-{i}", src[i * n:(i + 1) * n], dst[i * n:(i + 1) * n])
                    for i in range(args.concurrent)]
        if args.two_processes:  # the consumer checks the blocks
            seconds, submit = handoff_to_process(producer, consumer, requests, args.step_ms / 1e3, pulls)
            phases = []
        else:
            seconds, submit, phases = handoff(producer, consumer, requests, args.step_ms / 1e3, pulls, timeline)
            layer = next(iter(pcache))
            for _, s, d in requests:
                assert torch.equal(ccache[layer][:, d[-1]].view(torch.int16).cpu(),
                                   pcache[layer][:, s[-1]].view(torch.int16).cpu()), "a block differs"
        if not r:
            continue
        times.append(seconds)
        if print_rounds:
            raw = "" if args.device == "cpu" else \
                f" {raw_copy_seconds(total, args.device, args.consumer_device) * 1e3:.2f}"
            if args.raw_blocks:
                raw += f" {raw_blocks_seconds(pcache, ccache, src, dst, args.device) * 1e3:.2f}"
            print(tokens, total, f"{seconds * 1e3:.2f}", f"{total / seconds / 1e9:.3f}",
                  f"{submit * 1e3:.3f}{raw}", *(f"{p:.2f}" for p in phases), flush=True)
    return times


if __name__ == "__main__":
    main()
