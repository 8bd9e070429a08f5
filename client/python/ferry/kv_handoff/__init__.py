"""KV-cache handoff between a producer (prefill) and a consumer (decode), push model,
with no side channel: the core a serving engine's KV connector drives (no engine import).

Each side holds one region per layer, in the FlashAttention layout
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (K half, then V half; one half
for MLA caches). The producer publishes a small mailbox region's descriptor (in vLLM, in
the request's kv_transfer_params); the consumer sends it, through the agents (message
entries of a write queue to that mailbox: no RPC, in order): once per producer its
layout and layer descriptors (HELLO), then per request the blocks it wants filled
(PULL). The producer answers a PULL with one batch write — the request's blocks in every
layer, K and V, as one transfer — whose notification names the request; the consumer
counts it as received. The PULLs of one consumer that the producer reads together (a
decode step's, while it answered earlier ones) share one such write, whose notification
names them all. Both sides read their notifications from their session's inbox (shared
memory, no stream): the consumer when polled, the producer as they arrive, on a
responder thread that sleeps on the inbox's doorbell. The write goes
as a batch entry of a write queue to that consumer (no RPC: the parts and block ids go
through shared memory), or as one ``write_batch`` RPC where a queue cannot take it (more
than 64 layers, a full queue or block table).

    spec = KVCacheSpec(num_blocks=4096, block_bytes=32768, halves=2)
    producer = KVProducer(client, spec, layer_regions, engine_id="prefill-0")
    producer.hold("req-1", src_block_ids, lease=30.0)      # after prefill
    params = {"mailbox": producer.mailbox.hex(), ...}       # to the consumer
    consumer = KVConsumer(client, spec, layer_regions, engine_id="decode-0")
    consumer.pull("req-1", bytes.fromhex(params["mailbox"]), dst_block_ids, skip=0)
    # or a decode step's at once: consumer.pull_many([PullRequest("req-1", mailbox, ids), ...])
    ... producer.poll() -> Progress(done={"req-1"}, failed={})   # blocks may be freed
    ... consumer.poll() -> Progress(done={"req-1"}, failed={})   # blocks may be used

A consumer that gives a request up (an abort) sends CANCEL: a producer that has not
started the write drops the request and says so; one that has, lets the write answer.
A long request's block ids span several PULL messages (4 KiB each).

A consumer whose layer regions are in window mode (registered with write_windows) opens
a write window over each pulled request's blocks for that producer alone, as an entry of
its queue to the producer (a step's opens together, in pull_many), the PULL carrying it;
the window is closed before poll() reports the request, so nothing lands in its blocks
afterwards, however late the producer's write comes.

Failures are reported, never waited on forever: a PULL that does not match what the
producer holds (unknown request, block counts, layouts) fails that request on the
producer and, through a notification with an error code, on the consumer; a consumer
that never pulls lets the lease expire (the producer frees the blocks); a consumer that
hears nothing before its timeout reports the request failed; a consumer whose producer's
mailbox is gone (PING refused) reports its requests failed within about a second.

The messages' bytes are defined once, in ``wire``. The package: ``producer``
(KVProducer), ``consumer`` (KVConsumer), ``wire`` (the messages), ``_common`` (what both
sides share); the names below are all a connector needs.
"""
from ._common import KVCacheSpec, Progress, new_request_secret
from .consumer import CANCELLED, KVConsumer, PullRequest
from .producer import KVProducer, refuse

__all__ = ["CANCELLED", "KVCacheSpec", "KVConsumer", "KVProducer", "Progress", "PullRequest", "new_request_secret",
           "refuse"]
