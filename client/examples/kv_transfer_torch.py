#!/usr/bin/env python3
"""A KV-block transfer between two PyTorch processes (prefill -> decode) through ferry.

    python3 client/examples/kv_transfer_torch.py /run/ferry/ferry.sock

Each process owns a paged KV cache as one tensor [layers, 2 (K, V), blocks, block_size,
heads, head_dim] on its own GPU (prefill: GPU 0, decode: the last GPU) and registers it
with ferry.Client.register_cuda (allocated with ferry.cuda.empty, so it goes as a POSIX fd;
FERRY_KV_ALLOC=torch uses PyTorch's allocator and a legacy IPC handle). The decode side picks the block ids it has free and
sends them with its descriptor; prefill maps its sequence's blocks to them with
ferry.KVLayout, writes all layers' K and V in one request, and the decode side checks
the blocks it received once notified.
"""
import multiprocessing as mp
import os
import sys

LAYERS, BLOCKS, BLOCK, HEADS, DIM = 8, 1024, 16, 8, 128


def layout(ferry):
    return ferry.KVLayout(num_layers=LAYERS, num_blocks=BLOCKS, block_size=BLOCK, num_heads=HEADS, head_dim=DIM,
                          element_size=2)


def alloc(ferry, torch, device):
    """The KV cache: from ferry.cuda.empty (fd handle, fastest) unless FERRY_KV_ALLOC=torch
    (PyTorch's caching allocator: legacy IPC handle)."""
    shape = (LAYERS, 2, BLOCKS, BLOCK, HEADS, DIM)
    if os.environ.get("FERRY_KV_ALLOC") == "torch":
        return torch.empty(shape, dtype=torch.bfloat16, device=f"cuda:{device}")
    return ferry.cuda.empty(shape, torch.bfloat16, device)


def decode(socket, conn, device):
    import torch
    import ferry

    torch.cuda.set_device(device)
    cache = alloc(ferry, torch, device)
    cache.zero_()
    with ferry.Client(socket) as client:
        region = client.register_cuda(cache)
        free = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(2))[:300].tolist()
        conn.send((region.descriptor(), free))
        note = next(client.notifications(timeout=60))
        expected = conn.recv_bytes()  # the prefill side's blocks, in our slot order
        got = cache[:, :, free].cpu().view(torch.int16).numpy().tobytes()
        ok = note.bytes == LAYERS * 2 * len(free) * layout(ferry).block_bytes and got == expected
        print(f"decode (GPU {device}): {note.bytes} bytes in {len(free)} blocks x {LAYERS} layers x K/V; "
              f"{'every block matches' if ok else 'MISMATCH'}")
        region.deregister()
        sys.exit(0 if ok else 1)


def prefill(socket, conn, device):
    import torch
    import ferry

    torch.cuda.set_device(device)
    cache = alloc(ferry, torch, device)
    cache.copy_(torch.randn(cache.shape, dtype=cache.dtype, device=cache.device))
    with ferry.Client(socket) as client:
        region = client.register_cuda(cache)
        dst, dst_ids = conn.recv()
        src_ids = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(1))[:len(dst_ids)].tolist()
        chunks = layout(ferry).chunks(src_ids, dst_ids)
        r = client.write(region, dst, chunks, tag=1, notify=True).result(timeout=60)
        conn.send_bytes(cache[:, :, src_ids].cpu().view(torch.int16).numpy().tobytes())
        print(f"prefill (GPU {device}): {len(chunks)} chunks, {r.bytes} bytes over the {r.path} path "
              f"in {r.duration_ns / 1e3:.0f} us")
        region.deregister()


if __name__ == "__main__":
    import torch

    sock = sys.argv[1] if len(sys.argv) > 1 else "/run/ferry/ferry.sock"
    mp.set_start_method("spawn")  # CUDA and fork do not mix
    a, b = mp.Pipe()
    last = torch.cuda.device_count() - 1
    procs = [mp.Process(target=decode, args=(sock, a, last)), mp.Process(target=prefill, args=(sock, b, 0))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    sys.exit(0 if all(p.exitcode == 0 for p in procs) else 1)
