"""ferry as vLLM's KV-cache transfer backend for prefill/decode disaggregation.

    pip install './client/python[vllm]'
    vllm serve MODEL --kv-transfer-config '{"kv_connector": "FerryConnector",
        "kv_connector_module_path": "ferry.vllm", "kv_role": "kv_producer",
        "engine_id": "prefill-0", "kv_connector_extra_config": {"socket": "/run/ferry/ferry.sock"}}'

(kv_role "kv_consumer" on the decode side.) ``FerryConnector`` is loaded on first use,
so ``ferry.vllm.scheduler`` and ``ferry.vllm.worker`` import without vLLM.
"""
from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("FerryConnector", "FerryConnectorMetadata"):
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module 'ferry.vllm' has no attribute {name!r}")
