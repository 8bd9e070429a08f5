"""FerryConnector's worker side (each vLLM worker process, one per TP rank): registers the
rank's KV cache with the node's ferry agent and carries out the scheduler's StepPlans
through ferry.kv_handoff. No vLLM import: the GPU host, which has no vLLM, runs this
module as it is.

    worker = FerryWorker(socket, "decode-0", tp_rank=0, producer=False, consumer=True)
    worker.register_kv_caches({"model.layers.0.self_attn.attn": kv0, ...})
    worker.apply(plan)                     # every step, the scheduler's StepPlan
    r = worker.results()                   # every step: sending, recving, failed, bad blocks

KV tensors: one per layer, FlashAttention's ``[2, num_blocks, block_size, heads, head_dim]``
or MLA's ``[num_blocks, block_size, latent]``; CUDA tensors from PyTorch's caching
allocator (legacy IPC handles, so not expandable segments) or ferry.cuda.empty, or CPU
tensors from ferry.host.empty.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Dict, List, Mapping, Optional, Set

from .. import errors
from ..client import Client
from ..kv_handoff import CANCELLED, KVCacheSpec, KVConsumer, KVProducer, refuse
from .scheduler import StepPlan

logger = logging.getLogger("ferry.vllm")


@dataclasses.dataclass
class StepResults:
    finished_sending: Set[str] = dataclasses.field(default_factory=set)
    finished_recving: Set[str] = dataclasses.field(default_factory=set)
    failed_recving: Set[str] = dataclasses.field(default_factory=set)
    invalid_block_ids: Set[int] = dataclasses.field(default_factory=set)


def cache_spec(tensors: List) -> KVCacheSpec:
    """The KVCacheSpec of one rank's layer tensors; raises ValueError on what ferry cannot move."""
    if not tensors:
        raise ValueError("no KV cache tensors to register")
    first = tensors[0]
    if first.dim() == 5 and first.shape[0] == 2:  # FlashAttention: K and V halves
        halves, num_blocks = 2, first.shape[1]
    elif first.dim() == 3:  # MLA: one latent per token
        halves, num_blocks = 1, first.shape[0]
    else:
        raise ValueError(f"KV cache tensors of shape {tuple(first.shape)}: FerryConnector moves FlashAttention's "
                         "[2, num_blocks, block_size, heads, head_dim] or MLA's [num_blocks, block_size, latent]")
    for t in tensors:
        if t.shape != first.shape or t.dtype != first.dtype or not t.is_contiguous():
            raise ValueError("every layer's KV tensor must be contiguous, with one shape and dtype")
    return KVCacheSpec(num_blocks=num_blocks, block_bytes=first.numel() * first.element_size() // (halves * num_blocks),
                       halves=halves)


class FerryWorker:

    def __init__(self, socket: str, engine_id: str, tp_rank: int, producer: bool, consumer: bool,
                 lease: float = 30.0, timeout: float = 30.0, traffic_class: Optional[str] = None):
        self.engine_id, self.tp_rank = f"{engine_id}/{tp_rank}", tp_rank
        self._roles = (producer, consumer)
        self._lease, self._timeout = lease, timeout
        self._client = Client(socket, traffic_class=traffic_class)  # the class of the handoffs' writes
        self.producer: Optional[KVProducer] = None
        self.consumer: Optional[KVConsumer] = None
        self._pulled: Dict[str, List[int]] = {}  # consumer: request -> its blocks being filled
        self._held: Set[str] = set()  # producer: requests not yet reported in finished_sending
        self._pending = StepResults()  # reported at the next results()
        self._tensors: List = []
        self._spec: Optional[KVCacheSpec] = None
        self._next_reconnect = 0.0
        self.mailbox_changed = False  # a new mailbox since the scheduler last heard (after a reconnect)
        self._orphans: List[tuple] = []  # consumers whose writes were lost with the old session

    def register_kv_caches(self, kv_caches: Mapping[str, object]) -> None:
        """Registers every layer's tensor once (in the model's layer order, which both
        sides share) and starts the producer and consumer roles."""
        tensors = list(kv_caches.values())
        self._spec = cache_spec(tensors)
        if any(t.is_cuda for t in tensors) and "expandable_segments:true" in \
                os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower():
            raise errors.FailedPrecondition(
                "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True: such memory has no CUDA IPC handle for the "
                "ferry agent to map. Unset it (or set expandable_segments:False) for vLLM's workers")
        self._tensors = tensors
        self._start()

    def _start(self) -> None:
        regions = [self._client.register_tensor(t) for t in self._tensors]
        if self._roles[0]:
            self.producer = KVProducer(self._client, self._spec, regions, self.engine_id)
        if self._roles[1]:
            self.consumer = KVConsumer(self._client, self._spec, regions, self.engine_id, timeout=self._timeout)

    @property
    def mailbox(self) -> Optional[bytes]:
        """This rank's producer mailbox (the scheduler puts it in kv_transfer_params)."""
        return self.producer.mailbox if self.producer else None

    def apply(self, plan: StepPlan) -> None:
        for rid, blocks in plan.hold.items():
            if self.producer is None:  # the agent restarted and is not back: nothing can be handed off
                logger.warning("FerryConnector: request %s's blocks were not handed off: no ferry agent", rid)
                self._pending.finished_sending.add(rid)
                continue
            self._held.add(rid)
            self.producer.hold(rid, blocks, lease=self._lease)
        for rid, pull in plan.pull.items():
            self._pulled[rid] = pull.dst_ids
            if self.consumer is None:
                self._fail(rid, "no ferry agent (it restarted and is not back yet)")
                continue
            try:
                self.consumer.pull(rid, pull.mailboxes[self.tp_rank], pull.dst_ids, skip=pull.skip,
                                   producer_request_id=pull.producer_request_id)
            except (errors.FerryError, ValueError) as e:  # e.g. the producer's mailbox is gone
                self._fail(rid, f"asking the producer failed: {e}")
        for rid, (producer_rid, mailboxes, pulled) in plan.cancel.items():
            if self.consumer is None:  # the regions went with the old session: nothing can land
                if self._pulled.pop(rid, None) is not None:
                    self._pending.finished_recving.add(rid)
                continue
            try:
                settled = self.consumer.cancel(rid, mailboxes[self.tp_rank], producer_request_id=producer_rid)
            except errors.FerryError as e:
                logger.warning("FerryConnector: telling the producer that %s was aborted failed: %s", rid, e)
                settled = True  # it will let the blocks go when its lease expires
            if pulled and settled and self._pulled.pop(rid, None) is not None:  # not reported yet
                self._pending.finished_recving.add(rid)
        for rid, (blocks, why) in plan.fail.items():
            self._pulled[rid] = blocks
            self._fail(rid, why)

    def _fail(self, rid: str, why: str) -> None:
        logger.error("FerryConnector: request %s did not receive its KV: %s", rid, why)
        self._pending.finished_recving.add(rid)
        self._pending.failed_recving.add(rid)
        self._pending.invalid_block_ids.update(self._pulled.pop(rid, ()))

    def results(self) -> StepResults:
        """What finished since the last call."""
        if not self._client.connected():
            self._recover()
        if self.producer is not None:
            p = self.producer.poll()
            self._pending.finished_sending |= p.done
            self._held -= p.done
            for rid, why in p.failed.items():
                if rid:
                    logger.warning("FerryConnector: request %s's blocks were not handed off: %s", rid, why)
                    self._pending.finished_sending.add(rid)
                    self._held.discard(rid)
                else:
                    logger.warning("FerryConnector: %s", why)
        if self.consumer is not None:
            c = self.consumer.poll()
            for rid in c.done:
                self._pending.finished_recving.add(rid)
                self._pulled.pop(rid, None)
            for rid, why in c.failed.items():
                if why == CANCELLED:
                    self._pending.finished_recving.add(rid)
                    self._pulled.pop(rid, None)
                else:
                    self._fail(rid, why)
        out, self._pending = self._pending, StepResults()
        return out

    def _recover(self) -> None:
        """The agent ended the session (it restarted): what was in flight through it failed,
        at once; then a new session, at most one attempt a second, with every layer
        registered again and a new mailbox for the scheduler (mailbox_changed)."""
        if self.producer is not None or self.consumer is not None:
            if self.producer is not None:
                self._orphans = self.producer.in_flight()
            for rid in sorted(self._held):
                logger.warning("FerryConnector: request %s's blocks were not handed off: the ferry agent restarted",
                               rid)
            self._pending.finished_sending |= self._held
            self._held.clear()
            for rid in list(self._pulled):
                self._fail(rid, "the ferry agent restarted while the request's KV was in flight")
            self._close_sides()
        if time.monotonic() < self._next_reconnect:
            return
        self._next_reconnect = time.monotonic() + 1.0
        try:
            self._client.reconnect(timeout=0)
            self._start()
        except errors.FerryError as e:
            logger.warning("FerryConnector: the ferry agent is not back yet: %s", e)
            return
        self.mailbox_changed = True
        logger.warning("FerryConnector: reconnected to the ferry agent; KV caches registered again")
        # Consumers waiting for writes that died with the old session hear it now, not at their timeout.
        for answer_to in self._orphans:
            try:
                refuse(self._client, answer_to, "the producer's ferry agent restarted during the write")
            except errors.FerryError as e:
                logger.warning("FerryConnector: could not tell a consumer its write was lost: %s", e)
        self._orphans = []

    def _close_sides(self) -> None:
        for side in (self.producer, self.consumer):
            if side is not None:
                side.close()
        self.producer = self.consumer = None

    def close(self) -> None:
        self._close_sides()
        self._client.close()
