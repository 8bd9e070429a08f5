"""FerryConnector's worker side (each vLLM worker process, one per TP rank): registers the
rank's KV cache with the node's ferry agent and carries out the scheduler's StepPlans
through ferry.kv_handoff. No vLLM import: the GPU host, which has no vLLM, runs this
module as it is.

    worker = FerryWorker(socket, "decode-0", tp_rank=0, producer=False, consumer=True)
    worker.register_kv_caches({"model.layers.0.self_attn.attn": kv0, ...})
    worker.apply(plan)                     # every step, the scheduler's StepPlan
    r = worker.results()                   # every step: sending, recving, failed, bad blocks

KV tensors: one per layer, as vLLM's attention backends allocate them (layer_spec: blocks
outermost in memory, or K and V halves outermost); CUDA tensors from PyTorch's caching
allocator (legacy IPC handles, so not expandable segments) or ferry.cuda.empty, or CPU
tensors from ferry.host.empty.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Set

from .. import errors
from ..client import Client
from ..kv_handoff import CANCELLED, KVCacheSpec, KVConsumer, KVProducer, PullRequest, refuse
from ..kv_handoff.producer import AnswerTo
from .scheduler import StepPlan
from .stats import HandoffCounts

logger = logging.getLogger("ferry.vllm")


@dataclasses.dataclass
class StepResults:
    finished_sending: Set[str] = dataclasses.field(default_factory=set)
    finished_recving: Set[str] = dataclasses.field(default_factory=set)
    failed_recving: Set[str] = dataclasses.field(default_factory=set)
    invalid_block_ids: Set[int] = dataclasses.field(default_factory=set)


def _physical_dims(t: Any) -> List[int]:
    """``t``'s dimensions from the outermost in memory to the innermost, size-1 ones left
    out; raises ValueError unless ``t`` covers its memory densely (a permuted view of a
    contiguous allocation, as vLLM makes its caches through a backend's stride order)."""
    dims = sorted((d for d in range(t.dim()) if t.shape[d] > 1), key=lambda d: t.stride(d), reverse=True)
    expect = 1
    for d in reversed(dims):
        if t.stride(d) != expect:
            raise ValueError(f"a KV cache tensor of shape {tuple(t.shape)} and strides {tuple(t.stride())} has gaps "
                             "or overlaps in memory (a layout with blocks outside layers, such as vLLM's BLNHC): "
                             "FerryConnector moves layers that each fill their own memory; use a layer-outermost "
                             "layout (VLLM_KV_CACHE_LAYOUT=LBNHC, vLLM's default, or LBHNC)")
        expect *= t.shape[d]
    return dims


def layer_spec(t: Any) -> KVCacheSpec:
    """How one layer's KV tensor holds its blocks in memory, whatever its logical shape:
    vLLM allocates each layer's cache contiguously in its backend's stride order and hands
    the connector a permuted view. Two arrangements can be moved block by block:

    - blocks outermost (FlashAttention's packed ``(num_blocks, heads, block_size, 2 * head_dim)``,
      MLA's ``(num_blocks, block_size, latent)``, or ``[2, num_blocks, ...]`` allocated blocks
      first): each block one run of bytes, K and V together (halves 1);
    - K / V outermost (``[2, num_blocks, block_size, heads, head_dim]`` allocated as shaped):
      each block a run in the K half and one in the V half (halves 2).

    Raises ValueError for anything else."""
    dims = _physical_dims(t)
    if len(dims) < 2:
        raise ValueError(f"a KV cache tensor of shape {tuple(t.shape)} has no block dimension")
    outer, elt = dims[0], t.element_size()
    if outer == 1 and t.shape[0] == 2:  # [2, num_blocks, ...] with its blocks outermost
        return KVCacheSpec(num_blocks=t.shape[1], block_bytes=t.stride(1) * elt, halves=1)
    if outer == 0 and t.shape[0] == 2 and t.dim() >= 4 and dims[1] == 1:  # K / V halves outermost
        return KVCacheSpec(num_blocks=t.shape[1], block_bytes=t.stride(1) * elt, halves=2)
    if outer == 0:
        return KVCacheSpec(num_blocks=t.shape[0], block_bytes=t.stride(0) * elt, halves=1)
    raise ValueError(f"a KV cache tensor of shape {tuple(t.shape)} and strides {tuple(t.stride())}: FerryConnector "
                     "moves caches whose blocks (or K / V halves) are outermost in memory")


def cache_spec(tensors: List[Any]) -> KVCacheSpec:
    """The KVCacheSpec of one rank's layer tensors; raises ValueError on what ferry cannot move."""
    if not tensors:
        raise ValueError("no KV cache tensors to register")
    spec = layer_spec(tensors[0])
    for t in tensors:
        if t.shape != tensors[0].shape or t.stride() != tensors[0].stride() or t.dtype != tensors[0].dtype:
            raise ValueError("every layer's KV tensor must have one shape, layout and dtype")
    return spec


def physical_view(t: Any) -> Any:
    """``t``'s whole allocation as a flat contiguous tensor (what the agent registers)."""
    return t.as_strided((t.numel(),), (1,))


class FerryWorker:

    def __init__(self, socket: str, engine_id: str, tp_rank: int, producer: bool, consumer: bool,
                 lease: float = 30.0, timeout: float = 30.0, traffic_class: Optional[str] = None,
                 write_windows: bool = False):
        self.engine_id, self.tp_rank = f"{engine_id}/{tp_rank}", tp_rank
        self._roles = (producer, consumer)
        self._write_windows = write_windows and consumer
        self._lease, self._timeout = lease, timeout
        self._client = Client(socket, traffic_class=traffic_class)  # the class of the handoffs' writes
        self.producer: Optional[KVProducer] = None
        self.consumer: Optional[KVConsumer] = None
        self._pulled: Dict[str, List[int]] = {}  # consumer: request -> its blocks being filled
        self._pull_started: Dict[str, float] = {}  # consumer: request -> when it was pulled
        self.counts = HandoffCounts()  # for vLLM's stats (get_kv_connector_stats)
        self._held: Set[str] = set()  # producer: requests not yet reported in finished_sending
        self._pending = StepResults()  # reported at the next results()
        self._tensors: List[Any] = []  # torch tensors
        self._spec: Optional[KVCacheSpec] = None
        self._next_reconnect = 0.0
        self.mailbox_changed = False  # a new mailbox since the scheduler last heard (after a reconnect)
        self._orphans: List[AnswerTo] = []  # consumers whose writes were lost with the old session

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
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
        # A consumer's caches take writes only through the windows it opens per pulled
        # request, so that nothing lands in a block after vLLM gave it to another request.
        assert self._spec is not None  # register_kv_caches set it
        regions = [self._client.register_tensor(physical_view(t), write_windows=self._write_windows)
                   for t in self._tensors]
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
            self.producer.hold(rid, blocks, lease=self._lease, secret=plan.secrets.get(rid))
        pulls = []
        for rid, pull in plan.pull.items():
            self._pulled[rid] = pull.dst_ids
            self._pull_started[rid] = time.monotonic()
            if self.consumer is None:
                self._fail(rid, "no ferry agent (it restarted and is not back yet)")
                continue
            pulls.append(PullRequest(rid, pull.mailboxes[self.tp_rank], pull.dst_ids, pull.skip,
                                     pull.producer_request_id, pull.secret))
        if pulls and self.consumer is not None:  # the step's pulls together: their windows open at once
            for rid, e in self.consumer.pull_many(pulls).items():  # e.g. the producer's mailbox is gone
                self._fail(rid, f"asking the producer failed: {e}")
        for rid, (producer_rid, mailboxes, pulled) in plan.cancel.items():
            self._pull_started.pop(rid, None)  # an aborted request is not a handoff to time
            if self.consumer is None:  # the regions went with the old session: nothing can land
                if self._pulled.pop(rid, None) is not None:
                    self._pending.finished_recving.add(rid)
                continue
            try:
                settled = self.consumer.cancel(rid, mailboxes[self.tp_rank], producer_request_id=producer_rid,
                                               secret=plan.secrets.get(rid, b""))
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
        self.counts.failed_receives += 1
        self._pull_started.pop(rid, None)
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
            self.counts.sent += len(p.done)
            for rid, why in p.failed.items():
                if rid:
                    logger.warning("FerryConnector: request %s's blocks were not handed off: %s", rid, why)
                    self.counts.failed_sends += 1
                    self._pending.finished_sending.add(rid)
                    self._held.discard(rid)
                else:
                    logger.warning("FerryConnector: %s", why)
        if self.consumer is not None:
            c = self.consumer.poll()
            for rid in c.done:
                self._pending.finished_recving.add(rid)
                blocks = self._pulled.pop(rid, ())
                started = self._pull_started.pop(rid, None)
                if started is not None and self._spec is not None:
                    nbytes = len(blocks) * self._spec.halves * self._spec.block_bytes * len(self._tensors)
                    self.counts.record_received(nbytes, time.monotonic() - started)
            for rid, why in c.failed.items():
                if why == CANCELLED:
                    self._pending.finished_recving.add(rid)
                    self._pulled.pop(rid, None)
                    self._pull_started.pop(rid, None)
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
