"""Two real vLLM engines' KV side, stepped by hand: each a real vLLM Scheduler (built from
a VllmConfig over the config.json in model/, no weights or tokenizer) whose connector is
FerryConnector, and a FerryConnector worker whose KV caches vLLM's own planning lays out
and views (one host-memory allocation from ferry.host.empty, a view per layer, in the
layout vLLM resolves or the one a test asks for), registered with a real ferryd. A step does what vLLM's engine core and model runner do
around a forward pass (schedule; bind metadata, start_load_kv, wait_for_save,
get_transfer_results, get_block_ids_with_load_errors; update_from_output); the forward
pass itself is played by writing nothing: the producer's cache is filled with random
bytes up front, and a request's blocks are its prefill's output."""
import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    create_kv_cache_views,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

import ferry.host  # noqa: E402
from ferry.vllm import FerryConnector  # noqa: E402
from ferry.vllm.worker import layer_spec, physical_view  # noqa: E402

MODEL = str(pathlib.Path(__file__).parent / "model")
LAYERS, KV_HEADS, HEAD = 4, 2, 64  # model/config.json: 4 layers, 2 KV heads, hidden 256 / 4 heads
BLOCK_TOKENS = 16
init_none_hash(sha256)


class Engine:
    """One vLLM instance's scheduler and its workers' connectors (one per TP rank; their
    outputs combined by vLLM's own KVOutputAggregator when there are several)."""

    def __init__(self, role: str, agent_socket: str, engine_id: str, num_blocks: int = 64, policy: str = "fail",
                 tp: int = 1, latent: int = 0, layout: str = "", **extra):
        self.engine_id = engine_id
        cache = CacheConfig(block_size=BLOCK_TOKENS, enable_prefix_caching=True)
        cache.num_gpu_blocks = num_blocks
        self.config = VllmConfig(
            model_config=ModelConfig(model=MODEL, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048),
            scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=2048,
                                             is_encoder_decoder=False),
            cache_config=cache, device_config=DeviceConfig("cpu"), parallel_config=ParallelConfig(tensor_parallel_size=tp),
            kv_transfer_config=KVTransferConfig(kv_connector="FerryConnector", kv_connector_module_path="ferry.vllm",
                                                kv_role=role, engine_id=engine_id, kv_load_failure_policy=policy,
                                                kv_connector_extra_config={"socket": agent_socket, **extra}))
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        if latent:  # an MLA model's cache: one latent vector per token and layer, no K / V halves
            spec = MLAAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=1, head_size=latent, dtype=torch.bfloat16)
        else:
            spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=KV_HEADS, head_size=HEAD,
                                     dtype=torch.bfloat16)
        # vLLM's own planning and allocation, as its GPU model runner does them: the layout
        # it resolves (or the one asked for), one backing allocation (here ferry.host.empty,
        # which an agent can map) and a view per layer.
        if layout:
            cache.kv_cache_layout = layout
        else:
            resolve_kv_cache_layout(self.config, [[m.name for m in get_supported_kv_cache_layouts([])]], [spec])
        cache.num_gpu_blocks_override = num_blocks
        self.kv_cache_config = get_kv_cache_config_from_groups(self.config, [KVCacheGroupSpec(names, spec)],
                                                               available_memory=1 << 40)
        resolved = cache.get_resolved_kv_cache_layout()
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=_structured(self.config), block_size=BLOCK_TOKENS,
                                   log_stats=False)
        assert isinstance(self.scheduler.connector, FerryConnector)
        # What the model runner does at start-up: allocate the caches, register them,
        # and hand every worker's handshake metadata to the scheduler's connector.
        self.rank_caches, self.raws, self.workers, handshake = [], [], [], {}
        for rank in range(tp):
            caches = {}
            for tensor in self.kv_cache_config.kv_cache_tensors:
                raw = ferry.host.empty((tensor.size,), torch.int8)
                self.raws.append(raw)
                caches.update(zip(tensor.layers, create_kv_cache_views(raw, spec, num_blocks, resolved, tensor), strict=False))
            worker = _worker_of_rank(rank, self.config, self.kv_cache_config)
            worker.register_kv_caches(caches)
            meta = worker.get_handshake_metadata()
            if meta is not None:
                handshake[rank] = meta
            self.rank_caches.append(caches)
            self.workers.append(worker)
        # As vLLM does, also when no worker has metadata (a decode-only engine's).
        self.scheduler.connector.set_xfer_handshake_metadata(handshake)
        self.worker, self.caches = self.workers[0], self.rank_caches[0]
        self.aggregator = KVOutputAggregator(expected_finished_count=tp) if tp > 1 else None
        self.outputs = {}  # request id -> EngineCoreOutput (the last one)
        self.stats = None  # the workers' get_kv_connector_stats, aggregated as vLLM's logger does
        self.load_errors = set()

    def add(self, rid: str, prompt, max_tokens: int, params=None) -> Request:
        r = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=SamplingParams(
            max_tokens=max_tokens, ignore_eos=True), pooling_params=None,
                    block_hasher=get_request_block_hasher(BLOCK_TOKENS, sha256))
        r.kv_transfer_params = params
        self.scheduler.add_request(r)
        return r

    def step(self) -> None:
        out = self.scheduler.schedule()
        RECORDER.add(out.kv_connector_metadata.plan)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.scheduler.requests[rid]
            sampled.append([7] if r.num_computed_tokens >= r.num_tokens else [])
        outputs = []
        for w in self.workers:
            w.bind_connector_metadata(out.kv_connector_metadata)
            w.start_load_kv(None)
            w.wait_for_save()
            results = w.get_transfer_results(out.finished_req_ids)
            kv_out = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                       finished_recving=results.finished_recving or None,
                                       failed_recving=results.failed_recving,
                                       invalid_block_ids=w.get_block_ids_with_load_errors(),
                                       kv_connector_worker_meta=w.build_connector_worker_meta())
            stats = w.get_kv_connector_stats()  # as vLLM's model runner asks each step
            if stats is not None:
                self.stats = stats if self.stats is None else self.stats.aggregate(stats)
            w.clear_connector_metadata()
            outputs.append(ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                             sampled_token_ids=sampled, kv_connector_output=kv_out))
        output = self.aggregator.aggregate(outputs) if self.aggregator else outputs[0]
        self.load_errors |= output.kv_connector_output.invalid_block_ids
        eco = self.scheduler.update_from_output(out, output)
        for outs in eco.values():
            for o in outs.outputs:
                self.outputs[o.request_id] = o

    def abort(self, rid: str) -> None:
        self.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)

    def blocks(self, rid: str):
        return list(self.scheduler.kv_cache_manager.get_block_ids(rid)[0])

    def block_pieces(self, block_id: int, rank: int = 0):
        """Every layer's bytes of one block in one rank's cache, as byte tensors: a piece per
        layer, or two (K and V) where a layout keeps the halves apart."""
        pieces = []
        for t in self.rank_caches[rank].values():
            spec = layer_spec(t)
            flat = physical_view(t).view(torch.uint8)
            half = spec.num_blocks * spec.block_bytes
            for h in range(spec.halves):
                start = h * half + block_id * spec.block_bytes
                pieces.append(flat[start:start + spec.block_bytes])
        return pieces

    def block_bytes(self, block_id: int, rank: int = 0):
        return [piece.numpy().tobytes() for piece in self.block_pieces(block_id, rank)]

    def mark_block(self, block_id: int, value: int) -> None:
        for rank in range(len(self.rank_caches)):
            for piece in self.block_pieces(block_id, rank):
                piece.fill_(value)

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        for w in self.workers:
            w.shutdown()


class Recorder:
    """With FERRY_RECORD_REQUESTS=PATH, the plans the schedulers made (which blocks each
    request held, which a consumer pulled): tests/gpu/kv_handoff_gpu.py replays them with
    CUDA tensors on the GPU host, where vLLM cannot be installed."""

    def __init__(self):
        self.path = os.environ.get("FERRY_RECORD_REQUESTS")
        self.held, self.pulled = {}, {}

    def add(self, plan) -> None:
        if self.path:
            self.held.update(plan.hold)
            self.pulled.update({rid: (p.producer_request_id, p.dst_ids, p.skip) for rid, p in plan.pull.items()})

    def flush(self, test: str) -> None:
        if not self.path:
            return
        import json

        done = json.load(open(self.path)) if os.path.exists(self.path) else {}
        done[test] = [{"src": self.held[prid], "dst": dst, "skip": skip}
                      for rid, (prid, dst, skip) in self.pulled.items() if prid in self.held]
        with open(self.path, "w") as f:
            json.dump(done, f, indent=None, separators=(",", ":"))
            f.write("\n")
        self.held, self.pulled = {}, {}


RECORDER = Recorder()


def _worker_of_rank(rank, config, kv_cache_config):
    """A worker-side FerryConnector as TP rank ``rank``: a real vLLM worker learns its rank
    from vLLM's distributed state, which one test process does not set up."""
    import ferry.vllm.connector as connector

    own = connector._tp_rank
    connector._tp_rank = lambda: rank
    try:
        return FerryConnector(config, KVConnectorRole.WORKER, kv_cache_config)
    finally:
        connector._tp_rank = own


def _structured(config):
    from vllm.v1.structured_output import StructuredOutputManager

    return StructuredOutputManager(config)
