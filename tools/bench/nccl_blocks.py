#!/usr/bin/env python3
"""NCCL baselines for `tools/bench.sh gpu`: the paged KV-block case moved GPU0 -> GPU1.

For each (blocks, block size), with blocks scattered at random over 1 GiB on both sides:
  contiguous   one send/recv of blocks*block bytes (what NCCL does best)
  p2p-per-blk  one batched isend/irecv per block (batch_isend_irecv)
  gather-send  index_select into a staging buffer, send, index_copy_ out of one
Prints time per transfer and algbw (bytes / time), like nccl-tests.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

POOL = 1 << 30
CASES = [(16384, 32 << 10), (4096, 128 << 10)]


def timed(fn, iters):
    fn()  # warm up (connections, allocator)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / iters


def worker(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    pool = torch.empty(POOL, dtype=torch.uint8, device="cuda")
    rows = []
    for n, block in CASES:
        view = pool.view(-1, block)
        g = torch.Generator().manual_seed(n + rank)  # different scatter on each side
        ids = torch.randperm(POOL // block, generator=g)[:n].cuda()
        staging = torch.empty(n, block, dtype=torch.uint8, device="cuda")
        peer = 1 - rank

        def contiguous():
            if rank == 0:
                dist.send(staging, peer)
            else:
                dist.recv(staging, peer)

        def per_block():
            ops = []
            for i in ids.tolist():
                op = dist.isend if rank == 0 else dist.irecv
                ops.append(dist.P2POp(op, view[i], peer))
            for r in dist.batch_isend_irecv(ops):
                r.wait()

        def gather_send():
            if rank == 0:
                torch.index_select(view, 0, ids, out=staging)
                dist.send(staging, peer)
            else:
                dist.recv(staging, peer)
                view.index_copy_(0, ids, staging)

        for name, fn, iters in (("contiguous", contiguous, 20), ("p2p-per-blk", per_block, 2),
                                ("gather-send", gather_send, 20)):
            t = timed(fn, iters)
            rows.append((name, n, block, t))
    if rank == 0:
        print("# NCCL %s (PyTorch %s), GPU0 -> GPU1" % (".".join(map(str, torch.cuda.nccl.version())), torch.__version__))
        print("%-12s %8s %10s %12s %12s" % ("method", "blocks", "block(B)", "time(us)", "algbw(GB/s)"))
        for name, n, block, t in rows:
            print("%-12s %8d %10d %12.1f %12.1f" % (name, n, block, t * 1e6, n * block / t / 1e9))
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    if torch.cuda.device_count() < 2:
        print("# NCCL baseline skipped: needs 2 GPUs")
        sys.exit(0)
    mp.spawn(worker, args=(29500 + os.getpid() % 1000,), nprocs=2)
