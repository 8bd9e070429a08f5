"""FerryConnector: vLLM's KVConnectorBase_V1 over ferry (with stats.py, the only modules that
import vLLM).

The scheduler side (FerryScheduler) and the worker side (FerryWorker) hold the logic;
this class only adapts vLLM's calls to them. Configuration, in
``kv_connector_extra_config``:

    socket      the node agent's socket             (default /run/ferry/ferry.sock)
    lease_s     producer: how long held blocks wait for their consumer (default 30)
    timeout_s   consumer: how long a request waits for its KV before failing (default 30)
    traffic_class  the class of the handoffs' writes: latency, bulk or background (default:
                the agent's rule for the pod; agent/qos/README.md)
    write_windows  consumer: register the KV caches in window mode and open a write window
                per pulled request, so that no write lands in a block after the request
                ended (default false: it costs two RPCs per request and unshared writes;
                agent/README.md, "Write windows")
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import base as vllm_base
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..client import TRAFFIC_CLASSES
from .params import Layout
from .scheduler import FerryScheduler, StepPlan
from .stats import FerryKVConnectorStats, FerryPromMetrics
from .worker import FerryWorker

# The hooks below that only newer vLLM releases call use types those releases define; on
# older ones (0.26 has neither) they are plain stand-ins that nothing in vLLM reads.
KVConnectorWorkerMetadata: Any = getattr(vllm_base, "KVConnectorWorkerMetadata", object)


@dataclasses.dataclass
class _TransferResults:
    finished_sending: Set[str]
    finished_recving: Set[str]
    failed_recving: Set[str]


KVConnectorTransferResults: Any = getattr(vllm_base, "KVConnectorTransferResults", _TransferResults)


class FerryConnectorMetadata(KVConnectorMetadata):
    def __init__(self, plan: StepPlan):
        self.plan = plan


@dataclasses.dataclass
class FerryHandshakeMetadata(KVConnectorHandshakeMetadata):
    mailbox: Optional[bytes]


@dataclasses.dataclass
class FerryWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler: mailboxes that changed (a worker reconnected to a restarted agent)."""
    mailboxes: Dict[int, bytes]  # tp rank -> its mailbox

    def aggregate(self, other: "FerryWorkerMetadata") -> "FerryWorkerMetadata":
        return FerryWorkerMetadata({**self.mailboxes, **other.mailboxes})


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError):  # no distributed state: one process, rank 0
        return 0


def _layout(vllm_config: Any, kv_cache_config: Any) -> Layout:
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(f"FerryConnector moves one KV cache group; this model has {len(groups)}")
    spec = groups[0].kv_cache_spec
    dtype = str(spec.dtype).replace("torch.", "")
    # The memory layout vLLM resolved, in releases that name one (KVCacheLayout).
    memory = getattr(kv_cache_config, "kv_cache_layout", None) or getattr(vllm_config.cache_config, "kv_cache_layout",
                                                                          None)
    return Layout(dtype=dtype, num_layers=len(groups[0].layer_names), num_kv_heads=getattr(spec, "num_kv_heads", 1),
                  head_size=spec.head_size, block_size=spec.block_size, memory=memory or "")


def _extra_config(extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """kv_connector_extra_config, checked: a wrong value names its key."""
    out = {"socket": "/run/ferry/ferry.sock", "lease_s": 30.0, "timeout_s": 30.0, "traffic_class": None,
           "write_windows": False}
    for key, value in (extra or {}).items():
        if key == "socket":
            if not isinstance(value, str) or not value:
                raise ValueError(f"kv_connector_extra_config['socket'] must be the agent's socket path, got {value!r}")
        elif key in ("lease_s", "timeout_s"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"kv_connector_extra_config[{key!r}] must be a positive number of seconds, "
                                 f"got {value!r}")
            value = float(value)
        elif key == "write_windows":
            if not isinstance(value, bool):
                raise ValueError(f"kv_connector_extra_config['write_windows'] must be true or false, got {value!r}")
        elif key == "traffic_class":
            if value not in TRAFFIC_CLASSES:
                raise ValueError(f"kv_connector_extra_config['traffic_class'] must be one of "
                                 f"{sorted(TRAFFIC_CLASSES)}, got {value!r}")
        else:
            continue  # another connector's key (e.g. under MultiConnector): not ours to judge
        out[key] = value
    return out


class FerryConnector(KVConnectorBase_V1):

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = vllm_config.kv_transfer_config
        extra = _extra_config(cfg.kv_connector_extra_config)
        engine_id = cfg.engine_id or "ferry"
        self._scheduler: Optional[FerryScheduler] = None
        self._worker: Optional[FerryWorker] = None
        self._invalid: Set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = FerryScheduler(engine_id, _layout(vllm_config, kv_cache_config),
                                             vllm_config.parallel_config.tensor_parallel_size, cfg.is_kv_producer,
                                             cfg.is_kv_consumer)
        else:
            self._worker = FerryWorker(extra["socket"], engine_id, _tp_rank(), producer=cfg.is_kv_producer,
                                       consumer=cfg.is_kv_consumer, lease=extra["lease_s"], timeout=extra["timeout_s"],
                                       traffic_class=extra["traffic_class"], write_windows=extra["write_windows"])

    @property
    def _sched(self) -> FerryScheduler:
        """The scheduler side; vLLM calls its hooks on the scheduler's connector only."""
        if self._scheduler is None:
            raise RuntimeError("FerryConnector: a scheduler hook was called on a worker's connector")
        return self._scheduler

    @property
    def _work(self) -> FerryWorker:
        """The worker side; vLLM calls its hooks on the workers' connectors only."""
        if self._worker is None:
            raise RuntimeError("FerryConnector: a worker hook was called on the scheduler's connector")
        return self._worker

    # ------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return FerryConnectorMetadata(self._sched.build_plan())

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._sched.request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        self._sched.update_connector_output(connector_output.finished_sending, connector_output.finished_recving)
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, FerryWorkerMetadata):
            self._sched.update_mailboxes(meta.mailboxes)

    def has_pending_push_work(self) -> bool:
        return self._sched.has_pending_work()

    def set_xfer_handshake_metadata(self, metadata: Any) -> None:
        self._sched.set_mailboxes({rank: m.mailbox for rank, m in metadata.items() if m.mailbox is not None})

    # ------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._work.register_kv_caches(kv_caches)

    def get_handshake_metadata(self) -> Optional[KVConnectorHandshakeMetadata]:
        return FerryHandshakeMetadata(self._work.mailbox) if self._work.mailbox is not None else None

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        if not self._work.mailbox_changed or self._work.mailbox is None:
            return None
        self._work.mailbox_changed = False
        return FerryWorkerMetadata({self._work.tp_rank: self._work.mailbox})

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        # Loads run asynchronously (the producer writes); sending is answering pulls.
        self._work.apply(self._get_connector_metadata().plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # the producer's blocks are written whole, after the request's prefill

    def wait_for_save(self) -> None:
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        r = self._work.results()
        self._invalid = r.invalid_block_ids
        return KVConnectorTransferResults(finished_sending=r.finished_sending, finished_recving=r.finished_recving,
                                          failed_recving=r.failed_recving)

    def get_finished(self, finished_req_ids: set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    # ------------------------------------------------------------ stats (vLLM's log line and metrics)

    def get_kv_connector_stats(self) -> Optional[FerryKVConnectorStats]:
        data = self._worker.counts.take() if self._worker is not None else None
        return FerryKVConnectorStats(data=data) if data is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None) -> FerryKVConnectorStats:
        return FerryKVConnectorStats(data=data) if data is not None else FerryKVConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: List[str],
                           per_engine_labelvalues: Dict[int, List[str]]) -> Any:
        if FerryPromMetrics is None:
            return None
        return FerryPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
