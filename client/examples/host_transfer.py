#!/usr/bin/env python3
"""Two processes moving host memory through ferry (run with the agent's socket).

    python3 client/examples/host_transfer.py /run/ferry/ferry.sock

The receiver registers a region and hands its descriptor (bytes) to the sender over a
pipe, as pods would over any channel; the sender writes 16 MiB of random data in four
scattered chunks and asks for a notification; the receiver waits for it and checks the
bytes against the sender's digest.
"""
import hashlib
import multiprocessing as mp
import os
import sys

import ferry

SIZE = 16 << 20
CHUNKS = [(0, 8 << 20, 4 << 20), (4 << 20, 0, 4 << 20), (8 << 20, 12 << 20, 4 << 20), (12 << 20, 4 << 20, 4 << 20)]


def receiver(socket, to_sender, from_sender):
    with ferry.Client(socket) as client, client.register_host(SIZE) as region:
        to_sender.send(region.descriptor())
        note = next(client.notifications(timeout=30))
        digest = from_sender.recv()
        ok = note.tag == 7 and note.bytes == SIZE and hashlib.sha256(region.buffer).hexdigest() == digest
        print(f"receiver: notified of {note.bytes} bytes (tag {note.tag}); data {'matches' if ok else 'DIFFERS'}")
        sys.exit(0 if ok else 1)


def sender(socket, from_receiver, to_receiver):
    with ferry.Client(socket) as client, client.register_host(SIZE) as region:
        data = os.urandom(SIZE)
        region.buffer[:] = data
        dst = ferry.RegionDescriptor.from_bytes(from_receiver.recv())
        result = client.write(region, dst, CHUNKS, tag=7, notify=True).result(timeout=30)
        expected = bytearray(SIZE)
        for s, d, n in CHUNKS:
            expected[d:d + n] = data[s:s + n]
        to_receiver.send(hashlib.sha256(expected).hexdigest())
        print(f"sender: wrote {result.bytes} bytes over the {result.path} path in {result.duration_ns / 1e6:.2f} ms")


if __name__ == "__main__":
    sock = sys.argv[1] if len(sys.argv) > 1 else "/run/ferry/ferry.sock"
    desc_r, desc_w = mp.Pipe(duplex=False)
    sum_r, sum_w = mp.Pipe(duplex=False)
    rx = mp.Process(target=receiver, args=(sock, desc_w, sum_r))
    tx = mp.Process(target=sender, args=(sock, desc_r, sum_w))
    rx.start()
    tx.start()
    tx.join(60)
    rx.join(60)
    sys.exit(0 if tx.exitcode == 0 and rx.exitcode == 0 else 1)
