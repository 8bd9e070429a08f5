"""FerryConnector's scheduler side (vLLM's EngineCore process): decides, per engine step,
which requests the workers hold (producer), pull (consumer) or cancel, and keeps the
engine stepping while they are in flight. No vLLM import: vLLM's objects are used
through the attributes named here, and the plan it builds is plain data (StepPlan).

Producer (kv_producer): a request the proxy sent with ``do_remote_decode`` that ends
after its prefill keeps its blocks (``request_finished`` -> delay_free) for a consumer;
its kv_transfer_params name this engine's workers' mailboxes (params.py). The blocks
are freed when a worker reports the request in ``finished_sending``: written, refused,
cancelled by the consumer, or its lease expired.

Consumer (kv_consumer): a request with a producer's params waits for its prompt's KV
(``get_num_new_matched_tokens`` -> asynchronous load); once its blocks are allocated,
the workers ask the producer to fill those not cached here. Bad params, a refusal, a
failed write or a timeout are reported as a load failure, so vLLM's
``kv_load_failure_policy`` decides (recompute locally, or fail the request).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Set, Tuple

from ..kv_handoff import new_request_secret
from . import params as params_lib

logger = logging.getLogger("ferry.vllm")

_HELD_STATUSES = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


@dataclasses.dataclass
class Pull:
    """Ask ``mailboxes[tp_rank]`` to fill ``dst_ids`` with the request's blocks after ``skip``."""
    producer_request_id: str
    mailboxes: List[bytes]
    dst_ids: List[int]
    skip: int
    secret: bytes = b""  # the producer's for the request (params: ferry_request_secret)


@dataclasses.dataclass
class StepPlan:
    """What the workers do this step (the connector metadata's content)."""
    hold: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # producer: request -> blocks
    pull: Dict[str, Pull] = dataclasses.field(default_factory=dict)  # consumer
    # consumer: request -> (producer request id, its mailboxes, whether a pull is out)
    cancel: Dict[str, Tuple[str, List[bytes], bool]] = dataclasses.field(default_factory=dict)
    fail: Dict[str, Tuple[List[int], str]] = dataclasses.field(default_factory=dict)  # consumer: blocks, why
    # request -> its secret: the producer's for a request it holds, the consumer's copy
    # for one it cancels (a pull carries its own)
    secrets: Dict[str, bytes] = dataclasses.field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.hold or self.pull or self.cancel or self.fail)


class FerryScheduler:

    def __init__(self, engine_id: str, layout: params_lib.Layout, tp_size: int, is_producer: bool,
                 is_consumer: bool):
        self.engine_id, self.layout, self.tp_size = engine_id, layout, tp_size
        self.is_producer, self.is_consumer = is_producer, is_consumer
        self._mailboxes: Optional[List[bytes]] = None  # from the workers' handshake metadata
        self._plan = StepPlan()
        self._held: Set[str] = set()  # producer: until finished_sending
        self._receiving: Dict[str, params_lib.RemotePrefill] = {}  # consumer: until finished_recving

    def set_mailboxes(self, by_rank: Dict[int, bytes]) -> None:
        """Every rank's producer mailbox, from the workers' handshake metadata. A decode-only
        engine's workers have none, and vLLM then hands over an empty dict."""
        if not by_rank and not self.is_producer:
            return
        if sorted(by_rank) != list(range(self.tp_size)):
            raise ValueError(f"handshake metadata came from ranks {sorted(by_rank)}; "
                             f"tensor-parallel size is {self.tp_size}")
        self._mailboxes = [by_rank[r] for r in range(self.tp_size)]

    def update_mailboxes(self, by_rank: Dict[int, bytes]) -> None:
        """A worker's new mailbox (it reconnected to its restarted agent)."""
        if self._mailboxes is None:
            return
        for rank, mailbox in by_rank.items():
            if 0 <= rank < self.tp_size:
                self._mailboxes[rank] = mailbox

    # ---------------------------------------------------------------- consumer

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        p = request.kv_transfer_params
        if not self.is_consumer or not p or not p.get("do_remote_prefill"):
            return 0, False
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        p = request.kv_transfer_params
        if not self.is_consumer or not p or not p.get("do_remote_prefill"):
            return
        p["do_remote_prefill"] = False  # once: a preempted request re-enters here
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        all_ids = list(blocks.get_block_ids()[0])
        new_ids = list(blocks.get_unhashed_block_ids())
        try:
            remote = params_lib.parse(p, self.layout, self.tp_size, len(request.prompt_token_ids or ()))
            if len(all_ids) != len(remote.block_ids) or new_ids != all_ids[len(all_ids) - len(new_ids):]:
                raise params_lib.BadParams(f"this consumer allocated {len(all_ids)} blocks "
                                           f"({len(new_ids)} not cached); the producer holds {len(remote.block_ids)}")
        except params_lib.BadParams as e:
            logger.error("FerryConnector: request %s cannot load its KV from the producer: %s", rid, e)
            self._plan.fail[rid] = (new_ids, str(e))
            return
        self._receiving[rid] = remote
        self._plan.pull[rid] = Pull(remote.request_id, remote.mailboxes, new_ids, len(all_ids) - len(new_ids),
                                    remote.secret)

    # ---------------------------------------------------------------- both

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        p = request.kv_transfer_params
        rid = request.request_id
        if not p:
            return False, None
        if self.is_consumer and (p.get("do_remote_prefill") or rid in self._receiving):
            self._cancel(rid, p, len(request.prompt_token_ids or ()))
            return False, None  # vLLM itself keeps a waiting request's blocks until finished_recving
        if not self.is_producer or not p.get("do_remote_decode"):
            return False, None
        if request.status.name not in _HELD_STATUSES or not block_ids:
            return False, None  # aborted or failed during prefill: nothing to hand off
        if self._mailboxes is None:
            logger.error("FerryConnector: no worker mailboxes (handshake metadata missing); request %s "
                         "is not handed off", rid)
            return False, None
        self._held.add(rid)
        self._plan.hold[rid] = list(block_ids)
        secret = self._plan.secrets[rid] = new_request_secret()
        return True, params_lib.producer_params(self.engine_id, rid, block_ids, request.num_computed_tokens,
                                                self.tp_size, self._mailboxes, self.layout, secret)

    def _cancel(self, rid: str, p: Dict[str, Any], num_prompt_tokens: int) -> None:
        # A pulled request stays in _receiving until the worker reports it (finished_recving).
        remote = self._receiving.get(rid)
        pulled = remote is not None
        if remote is None:  # aborted before its blocks were allocated: tell the producer to let go
            p["do_remote_prefill"] = False
            try:
                remote = params_lib.parse(p, self.layout, self.tp_size, num_prompt_tokens)
            except params_lib.BadParams:
                return  # nothing a producer could be holding for us
        self._plan.cancel[rid] = (remote.request_id, remote.mailboxes, pulled)
        self._plan.secrets[rid] = remote.secret

    def build_plan(self) -> StepPlan:
        plan, self._plan = self._plan, StepPlan()
        return plan

    def update_connector_output(self, finished_sending: Optional[Set[str]],
                                finished_recving: Optional[Set[str]]) -> None:
        for rid in finished_sending or ():
            self._held.discard(rid)
        for rid in finished_recving or ():
            self._receiving.pop(rid, None)

    def has_pending_work(self) -> bool:
        return bool(self._held or self._receiving or not self._plan.empty())
