"""FerryConnector's handoffs in vLLM's own stats: its periodic "KV Transfer metrics" log
line and, on vLLM versions that have connector metrics, its Prometheus endpoint.

Each worker counts what it handed off (HandoffCounts, plain Python); vLLM collects the
counts from every worker each step (``get_kv_connector_stats``), adds them up
(``FerryKVConnectorStats.aggregate``) and logs or exports them:

    vllm:ferry_kv_handoffs_total{role="received"|"sent"}   requests whose KV arrived / was sent
    vllm:ferry_kv_handoff_failures_total{role=...}         requests whose handoff failed
    vllm:ferry_kv_received_bytes_total                     bytes written into this engine's KV
    vllm:ferry_kv_handoff_seconds                          pull to arrival, per received request
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

_MAX_SAMPLES = 1024  # durations kept between two collections (vLLM collects every step)


@dataclasses.dataclass
class HandoffCounts:
    received: int = 0
    received_bytes: int = 0
    failed_receives: int = 0
    sent: int = 0
    failed_sends: int = 0
    seconds: List[float] = dataclasses.field(default_factory=list)  # per received request

    def record_received(self, nbytes: int, seconds: float) -> None:
        self.received += 1
        self.received_bytes += nbytes
        if len(self.seconds) < _MAX_SAMPLES:
            self.seconds.append(seconds)

    def take(self) -> Optional[Dict[str, Any]]:
        """What was counted since the last take, as vLLM's stats payload (None: nothing)."""
        data = dataclasses.asdict(self)
        if not any(data.values()):
            return None
        for f in dataclasses.fields(self):
            setattr(self, f.name, [] if f.name == "seconds" else 0)
        return data


def _empty() -> Dict[str, Any]:
    return dataclasses.asdict(HandoffCounts())


try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError:  # pragma: no cover - every supported vLLM has it
    KVConnectorStats = object

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
    from vllm.v1.metrics.utils import create_metric_per_engine
except ImportError:  # a vLLM without connector metrics: the log line only
    KVConnectorPromMetrics = None


@dataclasses.dataclass
class FerryKVConnectorStats(KVConnectorStats):
    data: Dict[str, Any] = dataclasses.field(default_factory=_empty)

    def reset(self) -> None:
        self.data = _empty()

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in _empty())

    def aggregate(self, other: "FerryKVConnectorStats") -> "FerryKVConnectorStats":
        merged = {k: self.data.get(k, 0) + other.data.get(k, 0) for k in _empty() if k != "seconds"}
        merged["seconds"] = list(self.data.get("seconds", ())) + list(other.data.get("seconds", ()))
        return FerryKVConnectorStats(data=merged)

    def reduce(self) -> Dict[str, float]:
        d, seconds = self.data, sorted(self.data.get("seconds", ()))
        out = {"received": d.get("received", 0), "sent": d.get("sent", 0),
               "failed_receives": d.get("failed_receives", 0), "failed_sends": d.get("failed_sends", 0),
               "received_MB": round(d.get("received_bytes", 0) / 1e6, 3)}
        if seconds:
            out["handoff_p50_ms"] = round(1000 * seconds[len(seconds) // 2], 3)
            out["handoff_max_ms"] = round(1000 * seconds[-1], 3)
        return out


if KVConnectorPromMetrics is not None:

    class _FerryPromMetrics(KVConnectorPromMetrics):
        def __init__(self, vllm_config: Any, metric_types: Any, labelnames: List[str],
                     per_engine_labelvalues: Dict[int, List[str]]) -> None:
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

            def per_engine(metric: Any) -> Any:
                return create_metric_per_engine(metric, self.per_engine_labelvalues)

            def per_role(name: str, documentation: str) -> Dict[str, Dict[int, Any]]:
                metric = self._counter_cls(name=name, documentation=documentation, labelnames=labelnames + ["role"])
                return {role: {idx: metric.labels(*values, role) for idx, values in per_engine_labelvalues.items()}
                        for role in ("received", "sent")}

            self.handoffs = per_role("vllm:ferry_kv_handoffs_total", "Requests whose KV ferry handed off.")
            self.failures = per_role("vllm:ferry_kv_handoff_failures_total", "Requests whose ferry handoff failed.")
            self.received_bytes = per_engine(self._counter_cls(
                name="vllm:ferry_kv_received_bytes_total", documentation="Bytes of KV ferry wrote into this engine.",
                labelnames=labelnames))
            self.seconds = per_engine(self._histogram_cls(
                name="vllm:ferry_kv_handoff_seconds", documentation="A received request's pull to its KV's arrival.",
                buckets=[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0],
                labelnames=labelnames))

        def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
            d = transfer_stats_data
            self.handoffs["received"][engine_idx].inc(d.get("received", 0))
            self.handoffs["sent"][engine_idx].inc(d.get("sent", 0))
            self.failures["received"][engine_idx].inc(d.get("failed_receives", 0))
            self.failures["sent"][engine_idx].inc(d.get("failed_sends", 0))
            self.received_bytes[engine_idx].inc(d.get("received_bytes", 0))
            for s in d.get("seconds", ()):
                self.seconds[engine_idx].observe(s)
    FerryPromMetrics: Optional[type] = _FerryPromMetrics
else:
    FerryPromMetrics = None
