"""FerryConnector driven by two real vLLM schedulers (producer and consumer), moving real
bytes between two real ferryd agents (tcp;ofi_rxm between two network namespaces, conftest.py). Each
case checks the consumer's blocks byte for byte against the producer's and that both
engines end with every block free again."""
import functools
import random
import time

import pytest
import torch
from harness import BLOCK_TOKENS, RECORDER, Engine

import ferry

PROMPT = 40  # tokens: 3 blocks of 16, the last partial
FREE = 63  # an idle engine's free blocks: 64 less vLLM's null block


def fill(engine, seed):
    g = torch.Generator().manual_seed(seed)
    for raw in engine.raws:
        raw.copy_(torch.randint(-128, 128, raw.shape, dtype=torch.int8, generator=g))


@pytest.fixture
def pd(node_agents, request):
    a, b = node_agents
    engines = []

    def make(role, agent, engine_id, **extra):
        engines.append(Engine(role, agent.socket, engine_id, **extra))
        return engines[-1]

    def pair(p_extra=None, d_extra=None):
        p = make("kv_producer", a, "prefill-0", **(p_extra or {}))
        d = make("kv_consumer", b, "decode-0", **(d_extra or {}))
        fill(p, 1)
        fill(d, 2)
        return p, d

    yield pair
    for e in engines:
        e.close()
    RECORDER.flush(request.node.name)


def run(*engines, until, seconds=15.0):
    """Steps every engine until ``until()`` holds; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "timed out"
        for e in engines:
            e.step()
        time.sleep(0.002)


def prefill(p, rid, prompt):
    """The proxy's first leg: the producer prefills with max_tokens=1 and hands out params."""
    p.add(rid, prompt, 1, {"do_remote_decode": True})
    run(p, until=lambda: rid in p.outputs and p.outputs[rid].finished)
    params = p.outputs[rid].kv_transfer_params
    assert params and params["do_remote_prefill"], params
    return params


def test_one_request_moves_every_layer_byte_for_byte(pd):
    p, d = pd()
    prompt = [random.Random(3).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    src = params["remote_block_ids"]
    assert len(src) == 3 and p.free_blocks() == FREE - 3  # held for the consumer
    d.add("d-1", prompt, 3, params)
    seen = {}

    def landed():
        r = d.scheduler.requests.get("d-1")
        if r is not None and "dst" not in seen and d.blocks("d-1"):
            seen["dst"] = d.blocks("d-1")
        return "d-1" in d.outputs and d.outputs["d-1"].finished
    run(p, d, until=landed)
    for s, t in zip(src, seen["dst"], strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def test_handoffs_show_in_vllms_connector_stats_and_prometheus_metrics(pd):
    import prometheus_client

    from ferry.vllm import FerryConnector
    p, d = pd()
    prompt = [random.Random(4).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    dst = handoff(p, d, "d-1", prompt, params)
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)
    layer_bytes = sum(t.numel() * t.element_size() for t in d.caches.values()) // 64  # per block, all layers
    received, sent = d.stats.reduce(), p.stats.reduce()
    assert received["received"] == 1 and received["failed_receives"] == 0
    assert received["received_MB"] == round(len(dst) * layer_bytes / 1e6, 3)
    assert 0 < received["handoff_p50_ms"] < 15000
    assert sent["sent"] == 1 and sent["failed_sends"] == 0
    # What vLLM's logger process does with the payload: rebuild, then export.
    rebuilt = FerryConnector.build_kv_connector_stats(d.stats.to_dict())
    assert rebuilt.reduce() == received and not rebuilt.is_empty()
    registry = prometheus_client.CollectorRegistry()
    types = {prometheus_client.Counter: functools.partial(prometheus_client.Counter, registry=registry),
             prometheus_client.Gauge: functools.partial(prometheus_client.Gauge, registry=registry),
             prometheus_client.Histogram: functools.partial(prometheus_client.Histogram, registry=registry)}
    metrics = FerryConnector.build_prom_metrics(d.config, types, ["model_name", "engine"], {0: ["m", "0"]})
    metrics.observe(d.stats.to_dict(), engine_idx=0)
    metrics.observe(p.stats.to_dict(), engine_idx=0)
    labels = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("vllm:ferry_kv_handoffs_total", {**labels, "role": "received"}) == 1
    assert registry.get_sample_value("vllm:ferry_kv_handoffs_total", {**labels, "role": "sent"}) == 1
    assert registry.get_sample_value("vllm:ferry_kv_received_bytes_total", labels) == len(dst) * layer_bytes
    assert registry.get_sample_value("vllm:ferry_kv_handoff_seconds_count", labels) == 1


@pytest.mark.parametrize("layout, latent", [("LBHNC", 0), ("LBHNC", 576), ("LBNHC", 576)])
def test_each_layer_outermost_layout_moves_byte_for_byte(pd, layout, latent):
    # vLLM's default (LBNHC, FlashAttention's packed K and V, a permuted view of its layer)
    # is every other test's; here the other layer-outermost layout, and MLA in both.
    p, d = pd(p_extra={"layout": layout, "latent": latent}, d_extra={"layout": layout, "latent": latent})
    prompt = [random.Random(6).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    assert params["ferry_layout"].endswith(layout)
    dst = handoff(p, d, "d-1", prompt, params)
    for s, t in zip(params["remote_block_ids"], dst, strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def test_a_layout_with_blocks_outside_layers_is_refused_naming_the_fix(node_agents):
    with pytest.raises(ValueError) as e:
        Engine("kv_producer", node_agents[0].socket, "prefill-0", layout="BLNHC")
    assert "VLLM_KV_CACHE_LAYOUT=LBNHC" in str(e.value)


def test_handoffs_run_in_the_configured_traffic_class(pd, node_agents):
    p, d = pd(p_extra={"traffic_class": "latency"})
    prompt = [random.Random(4).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-c", prompt)
    src = params["remote_block_ids"]
    dst = handoff(p, d, "d-c", prompt, params)
    for s, t in zip(src, dst, strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    with ferry.Client(node_agents[0].socket) as c:  # the producer's agent: its pods' bytes by class
        by_class = [sum(t.fabric_bytes[i] for t in c.status().tenants) for i in range(3)]
    per_block = sum(len(half) for half in p.block_bytes(src[0]))
    assert by_class[0] >= len(src) * per_block and by_class[1:] == [0, 0], by_class
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def handoff(p, d, rid, prompt, params, max_tokens=2):
    """The proxy's second leg: the consumer takes the producer's params; returns the
    consumer's blocks for the request as allocated (read while it runs)."""
    d.add(rid, prompt, max_tokens, params)
    seen = []

    def finished():
        if not seen and rid in d.scheduler.requests and d.blocks(rid):
            seen.extend(d.blocks(rid))
        return rid in d.outputs and d.outputs[rid].finished
    run(p, d, until=finished)
    return seen


@pytest.mark.parametrize("windows", [False, True])
def test_eight_concurrent_requests(pd, windows):
    # With write_windows each request's blocks land through its own window, the requests
    # read together still one write (window spans).
    p, d = pd(d_extra={"write_windows": windows})
    rng = random.Random(4)
    prompts = {f"r{i}": [rng.randrange(1000) for _ in range(rng.randint(17, 120))] for i in range(8)}
    for rid, prompt in prompts.items():
        p.add(rid, prompt, 1, {"do_remote_decode": True})
    run(p, until=lambda: all(r in p.outputs and p.outputs[r].finished for r in prompts))
    for rid, prompt in prompts.items():
        d.add("d" + rid, prompt, 2, p.outputs[rid].kv_transfer_params)
    dst = {}

    def all_finished():
        for rid in prompts:
            if "d" + rid in d.scheduler.requests and rid not in dst and d.blocks("d" + rid):
                dst[rid] = d.blocks("d" + rid)
        return all("d" + r in d.outputs and d.outputs["d" + r].finished for r in prompts)
    run(p, d, until=all_finished)
    for rid in prompts:
        src = p.outputs[rid].kv_transfer_params["remote_block_ids"]
        assert len(dst[rid]) >= len(src)
        for s, t in zip(src, dst[rid], strict=False):
            assert d.block_bytes(t) == p.block_bytes(s), rid
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)
    assert not d.load_errors


def test_partial_prefix_hit_moves_only_the_missing_blocks(pd):
    p, d = pd()
    rng = random.Random(5)
    first = [rng.randrange(1000) for _ in range(PROMPT)]
    handoff(p, d, "d-a", first, prefill(p, "p-a", first))
    # A second prompt sharing the first two blocks: the consumer has them cached. Mark
    # them, so a write into them would show.
    second = first[:32] + [rng.randrange(1000) for _ in range(20)]
    params = prefill(p, "p-b", second)
    cached = d.scheduler.kv_cache_manager.get_computed_blocks(d.add("probe", second, 1))[0].get_block_ids()[0]
    d.abort("probe")
    assert len(cached) == 2
    for b in cached:
        d.mark_block(b, 3)
    marked = [d.block_bytes(b) for b in cached]
    dst = handoff(p, d, "d-b", second, params)
    assert dst[:2] == cached
    assert [d.block_bytes(b) for b in cached] == marked  # not written
    src = params["remote_block_ids"]
    for s, t in zip(src[2:], dst[2:], strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def test_abort_on_the_consumer_before_and_after_its_pull_frees_both_sides(pd):
    p, d = pd(p_extra={"lease_s": 60})
    prompt = list(range(PROMPT))
    # Before: aborted before it was ever scheduled; the producer hears of it at once
    # (not after its 60 s lease).
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    d.abort("d-1")
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE, seconds=5)
    # After: one step sends the pull, then the abort; whatever landed, both let go.
    params = prefill(p, "p-2", [x + 1 for x in prompt])
    d.add("d-2", [x + 1 for x in prompt], 2, params)
    d.step()
    assert d.free_blocks() < FREE
    d.abort("d-2")
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE, seconds=5)


def test_lease_expiry_frees_the_producer_when_no_consumer_comes(pd):
    p, _ = pd(p_extra={"lease_s": 1})
    prefill(p, "p-1", list(range(PROMPT)))
    assert p.free_blocks() == FREE - 3
    t0 = time.monotonic()
    run(p, until=lambda: p.free_blocks() == FREE, seconds=5)
    assert time.monotonic() - t0 >= 0.5


def test_a_producer_that_never_answers_fails_the_load_and_vllm_recomputes(pd, caplog):
    p, d = pd(d_extra={"timeout_s": 1, "policy": "recompute"})
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    # The producer's worker is gone (its pod died): its mailbox no longer exists.
    p.close()
    before = [d.block_bytes(b) for b in range(64)]
    t0 = time.monotonic()
    handoff(d, d, "d-1", prompt, params)
    assert time.monotonic() - t0 < 5
    assert d.load_errors  # reported through get_block_ids_with_load_errors
    assert "did not receive its KV" in caplog.text
    assert [d.block_bytes(b) for b in range(64)] == before  # nothing written
    assert d.outputs["d-1"].finish_reason.name == "LENGTH"  # recomputed here


def test_the_producers_agent_killed_mid_transfer_fails_only_that_request(pd, node_agents):
    p, d = pd(d_extra={"timeout_s": 2})
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    d.step()  # the pull is out
    node_agents[0].kill()
    t0 = time.monotonic()
    run(d, until=lambda: "d-1" in d.outputs and d.outputs["d-1"].finished, seconds=10)
    assert time.monotonic() - t0 < 5
    assert d.outputs["d-1"].finish_reason.name == "ERROR"
    # The consumer goes on serving: a request of its own runs to the end.
    d.add("local", list(range(20)), 2)
    run(d, until=lambda: "local" in d.outputs and d.outputs["local"].finished)
    run(d, until=lambda: d.free_blocks() == FREE)


def test_the_producers_agent_restarted_fails_the_request_in_flight_then_handoffs_resume(pd, node_agents,
                                                                                       agent_factory, caplog):
    p, d = pd(d_extra={"timeout_s": 30})
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    d.step()  # the pull is out
    run(p, d, until=lambda: p.worker._worker.producer.in_flight())  # and the write started
    a = node_agents[0]
    a.kill()
    agent_factory(*a.flags, dir=a.dir, wrap=a.wrap)  # the same socket, a new agent
    t0 = time.monotonic()
    run(p, d, until=lambda: "d-1" in d.outputs and d.outputs["d-1"].finished, seconds=10)
    # Either the write had landed before the agent died, or the producer, once back, told the
    # consumer it was lost — not the consumer's 30 s timeout.
    assert time.monotonic() - t0 < 5
    if d.outputs["d-1"].finish_reason.name != "LENGTH":
        assert d.outputs["d-1"].finish_reason.name == "ERROR"
        assert "agent restarted during the write" in caplog.text
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)  # the producer let go too
    # The producer's worker reconnected and registered its cache again; its scheduler
    # hands out the new mailbox: the next request moves, byte for byte.
    prompt = [x + 3 for x in prompt]
    old = params["ferry_mailboxes"]
    params = prefill(p, "p-2", prompt)
    assert params["ferry_mailboxes"] != old
    dst = handoff(p, d, "d-2", prompt, params)
    for s, t in zip(params["remote_block_ids"], dst, strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    assert d.outputs["d-2"].finish_reason.name == "LENGTH"


def test_tensor_parallel_two_ranks_each_fill_their_own_shard(pd):
    p, d = pd(p_extra={"tp": 2}, d_extra={"tp": 2})
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    assert len(params["ferry_mailboxes"]) == 2 and params["tp_size"] == 2
    dst = handoff(p, d, "d-1", prompt, params)
    for rank in (0, 1):  # rank r's blocks came from the producer's rank r
        for s, t in zip(params["remote_block_ids"], dst, strict=False):
            assert d.block_bytes(t, rank) == p.block_bytes(s, rank)
    assert p.block_bytes(params["remote_block_ids"][0], 0) != p.block_bytes(params["remote_block_ids"][0], 1)
    assert d.outputs["d-1"].finish_reason.name == "LENGTH"
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def test_an_mla_models_latent_cache_moves_byte_for_byte(pd, caplog):
    # DeepSeek-style MLA: one [num_blocks, block_size, latent] tensor per layer (kv_lora_rank
    # 512 + rope 64), so a block is one piece per layer rather than K and V.
    p, d = pd(p_extra={"latent": 576}, d_extra={"latent": 576})
    prompt = [random.Random(5).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    assert params["ferry_layout"] == "bfloat16 L4 H1x576 B16 LBNHC"
    dst = handoff(p, d, "d-1", prompt, params)
    assert len(p.block_bytes(0)) == 4 and len(p.block_bytes(0)[0]) == BLOCK_TOKENS * 576 * 2
    for s, t in zip(params["remote_block_ids"], dst, strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    assert d.outputs["d-1"].finish_reason.name == "LENGTH"
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


@pytest.mark.parametrize("p_extra, theirs", [
    ({"latent": 576}, "bfloat16 L4 H1x576 B16 LBNHC"),  # an MLA producer
    # LBHNC blocks have LBNHC's size and bytes in another order: copied as bytes, heads and
    # tokens would swap.
    ({"layout": "LBHNC"}, "bfloat16 L4 H2x64 B16 LBHNC"),
])
def test_a_producer_with_another_cache_layout_is_refused_naming_both(pd, caplog, p_extra, theirs):
    p, d = pd(p_extra=p_extra)
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    before = [d.block_bytes(b) for b in range(64)]
    d.add("d-1", prompt, 2, params)
    run(p, d, until=lambda: "d-1" in d.outputs and d.outputs["d-1"].finished)
    assert f"'{theirs}', this consumer's is 'bfloat16 L4 H2x64 B16 LBNHC'" in caplog.text
    assert d.outputs["d-1"].finish_reason.name == "ERROR"
    assert [d.block_bytes(b) for b in range(64)] == before


@pytest.mark.parametrize("params, why", [
    ({"do_remote_prefill": True}, "lack 'ferry_layout'"),
    # NixlConnector's params: foreign to ferry.
    ({"do_remote_prefill": True, "remote_engine_id": "x", "remote_block_ids": [1, 2, 3], "remote_host": "10.0.0.1",
      "remote_port": 5600, "tp_size": 1}, "are they from a FerryConnector producer"),
    ({"ferry_mailboxes": ["zz"]}, "ferry_mailboxes[0] is not a ferry region descriptor"),
    ({"ferry_mailboxes": ["00" * 40]}, "ferry_mailboxes[0] is not a ferry region descriptor"),
    ({"remote_block_ids": [1, 2, 3, 4]}, "the producer holds 4 blocks; a 40-token prompt fills 3"),
    ({"remote_block_ids": [1, -2, 3]}, "remote_block_ids must be non-negative integers"),
    ({"tp_size": "1"}, "kv_transfer_params['tp_size'] is str, not int"),
    ({"ferry_request_secret": "00"}, "ferry_request_secret'] must be 32..128 hex digits"),
])
def test_garbage_and_foreign_params_fail_the_load_and_write_nothing(pd, caplog, params, why):
    p, d = pd()
    good = prefill(p, "p-1", list(range(PROMPT)))
    bad = params if "remote_host" in params or len(params) == 1 and "do_remote_prefill" in params else \
        dict(good, **params)
    before = [d.block_bytes(b) for b in range(64)]
    d.add("d-bad", list(range(PROMPT)), 2, bad)
    run(d, until=lambda: "d-bad" in d.outputs and d.outputs["d-bad"].finished)
    assert why in caplog.text
    assert d.outputs["d-bad"].finish_reason.name == "ERROR"  # vLLM's default kv_load_failure_policy: fail
    assert [d.block_bytes(b) for b in range(64)] == before


def test_mismatched_layout_and_tp_size_are_refused_naming_both_sides(pd, caplog):
    p, d = pd()
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    for key, value, why in (("tp_size", 2, "tensor-parallel size 2, this consumer 1"),
                            ("ferry_layout", "float16 L4 H2x64 B16", "'float16 L4 H2x64 B16', this consumer's is")):
        bad = dict(params, **{key: value})
        rid = f"d-{key}"
        d.add(rid, prompt, 2, bad)
        run(p, d, until=lambda: rid in d.outputs and d.outputs[rid].finished)
        assert why in caplog.text
    run(p, d, until=lambda: d.free_blocks() == FREE)


@pytest.mark.parametrize("extra, why", [
    ({"lease_s": "abc"}, "kv_connector_extra_config['lease_s'] must be a positive number of seconds, got 'abc'"),
    ({"timeout_s": 0}, "kv_connector_extra_config['timeout_s'] must be a positive number of seconds, got 0"),
    ({"socket": ""}, "kv_connector_extra_config['socket'] must be the agent's socket path"),
    ({"traffic_class": "urgent"}, "kv_connector_extra_config['traffic_class'] must be one of ['background', 'bulk', "
                                  "'latency'], got 'urgent'"),
])
def test_bad_extra_config_is_refused_naming_the_key(node_agents, extra, why):
    with pytest.raises(ValueError) as e:
        Engine("kv_producer", node_agents[0].socket, "prefill-0", **extra)
    assert why in str(e.value)


def test_an_agent_that_is_not_there_is_named(tmp_path):
    with pytest.raises(ferry.FerryError) as e:
        Engine("kv_producer", str(tmp_path / "no.sock"), "prefill-0")
    assert "is ferryd running" in str(e.value)


# ---------------------------------------------------------------- the push inventory's hard cases
# (the reliability cases of vLLM's NIXL push connector; each: the decode's blocks hold
# exactly the producer's bytes, or the request fails through kv_load_failure_policy, and
# nothing lands in a block after vLLM gave it to another request)


def cached_blocks(d, prompt):
    """The consumer's prefix-cache hit for ``prompt``: its cached blocks, as a request would see them."""
    cached = d.scheduler.kv_cache_manager.get_computed_blocks(d.add("probe", prompt, 1))[0].get_block_ids()[0]
    d.abort("probe")
    return list(cached)


@pytest.mark.parametrize("prompt_len, shared_blocks", [
    (48, 1),  # the cached block at the front; the prompt a multiple of the block size
    (50, 2),  # tokens not a multiple of the block size
    (64, 3),  # a hit covering all but the last block
    (64, 4),  # the whole prompt cached: vLLM computes its last token again, here
])
def test_partial_prefix_hits_of_every_shape_write_only_the_missing_blocks(pd, prompt_len, shared_blocks):
    p, d = pd()
    rng = random.Random(prompt_len * 10 + shared_blocks)
    prompt = [rng.randrange(1000) for _ in range(prompt_len)]
    # Warm the consumer's prefix cache with the shared blocks (a request of its own).
    d.add("warm", prompt[:shared_blocks * BLOCK_TOKENS], 1)
    run(d, until=lambda: "warm" in d.outputs and d.outputs["warm"].finished)
    cached = cached_blocks(d, prompt)
    expect_cached = min(shared_blocks, (prompt_len - 1) // BLOCK_TOKENS)  # vLLM recomputes the last token
    assert len(cached) == expect_cached
    for b in cached:
        d.mark_block(b, 5)
    marked = [d.block_bytes(b) for b in cached]
    params = prefill(p, "p-1", prompt)
    src = params["remote_block_ids"]
    dst = handoff(p, d, "d-1", prompt, params)
    assert dst[:len(cached)] == cached
    assert [d.block_bytes(b) for b in cached] == marked  # not written
    for s, t in zip(src[len(cached):], dst[len(cached):], strict=False):
        assert d.block_bytes(t) == p.block_bytes(s)
    assert d.outputs["d-1"].finish_reason.name == "LENGTH" and not d.load_errors
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)


def free_blocks_stay_untouched(d, seconds=0.5):
    """Marks every free block of the consumer (what vLLM may give any request next), lets a
    late write land if one could, and checks the marks: nothing written into a block
    vLLM has taken back."""
    free = [b.block_id for b in d.scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()]
    assert len(free) == FREE
    for b in free:
        d.mark_block(b, 9)
    marked = [d.block_bytes(b) for b in free]
    time.sleep(seconds)
    assert [d.block_bytes(b) for b in free] == marked


def test_abort_on_decode_after_the_producers_write_started(pd):
    p, d = pd(p_extra={"lease_s": 60})
    prompt = [random.Random(11).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    d.step()  # the pull is out
    run(p, d, until=lambda: p.worker._worker.producer.in_flight() or "d-1" not in d.scheduler.requests
        or d.scheduler.requests["d-1"].status.name != "WAITING_FOR_REMOTE_KVS", seconds=5)
    d.abort("d-1")
    # vLLM keeps an aborted request's blocks until the connector reports it finished: both
    # sides let go once the write has ended, not before.
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE, seconds=10)
    free_blocks_stay_untouched(d)


def test_the_producers_lease_ending_with_a_pull_in_flight(pd):
    # The lease ends while the consumer's pull is on its way: either the producer still
    # answers it (its blocks are held until the write ends) or the consumer is told the
    # request is unknown and fails it; never a write from freed producer blocks.
    p, d = pd(p_extra={"lease_s": 0.3}, d_extra={"timeout_s": 5})
    prompt = [random.Random(12).randrange(1000) for _ in range(PROMPT)]
    params = prefill(p, "p-1", prompt)
    src_bytes = [p.block_bytes(s) for s in params["remote_block_ids"]]
    time.sleep(0.2)
    dst = handoff(p, d, "d-1", prompt, params)
    if d.outputs["d-1"].finish_reason.name == "LENGTH":
        assert [d.block_bytes(t) for t in dst] == src_bytes
    else:
        assert d.outputs["d-1"].finish_reason.name == "ERROR"
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == FREE)
    free_blocks_stay_untouched(d)


def test_the_producer_pod_dying_mid_pull_fails_only_that_request(pd):
    p, d = pd(d_extra={"timeout_s": 30})
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    d.step()  # the pull is out
    p.close()  # the producer's workers end their sessions, as a dying pod's do
    t0 = time.monotonic()
    run(d, until=lambda: "d-1" in d.outputs and d.outputs["d-1"].finished, seconds=20)
    if d.outputs["d-1"].finish_reason.name != "LENGTH":  # else the write had landed whole
        assert d.outputs["d-1"].finish_reason.name == "ERROR"
        assert time.monotonic() - t0 < 10, "the consumer waited for its timeout"
    run(d, until=lambda: d.free_blocks() == FREE)
    free_blocks_stay_untouched(d)


@pytest.mark.parametrize("windows", [True, False])
def test_a_write_after_the_consumers_timeout_lands_in_no_block_vllm_took_back(pd, windows):
    """The producer answers late (its responder held back 2 s) and, as a write already on
    its way would, takes no notice of the consumer's cancel; the decode engine's load times
    out after 0.5 s and vLLM takes the request's blocks back. With write_windows the
    consumer's agent refuses the producer's write when it comes; without, it lands in
    blocks vLLM may already have given to another request (the hazard, shown)."""
    p, d = pd(p_extra={"lease_s": 60}, d_extra={"timeout_s": 0.5, "write_windows": windows})
    producer = p.worker._worker.producer
    drain, until = producer._inbox.drain, time.monotonic() + 2.0
    producer._inbox.drain = lambda: drain() if time.monotonic() > until else []
    producer._on_cancel = lambda *args: None
    prompt = list(range(PROMPT))
    params = prefill(p, "p-1", prompt)
    d.add("d-1", prompt, 2, params)
    run(p, d, until=lambda: "d-1" in d.outputs and d.outputs["d-1"].finished, seconds=5)
    assert d.load_errors and d.free_blocks() == FREE  # failed, and its blocks are vLLM's again
    taken_back = [d.block_bytes(b) for b in range(64)]
    run(p, d, until=lambda: p.free_blocks() == FREE, seconds=10)  # the producer's write came and ended
    time.sleep(0.2)
    if windows:
        assert [d.block_bytes(b) for b in range(64)] == taken_back, "a late write landed"
    else:
        assert [d.block_bytes(b) for b in range(64)] != taken_back


def test_a_decode_request_waiting_for_its_kv_is_never_preempted_and_lands_whole(pd):
    """Memory pressure on the decode engine while a handoff is pending: vLLM preempts only
    running requests, and a request waiting for its KV is not one, so it keeps its blocks
    until the write has landed (which is why FerryConnector needs no handle_preemptions:
    it writes into no block of a running request, and a producer writes only from blocks
    of a finished one). Here a local request grows until it needs a block the cache does
    not have; it is preempted, the pending handoff is not, and both end whole."""
    p, d = pd(p_extra={"lease_s": 60}, d_extra={"num_blocks": 8})  # 7 usable blocks
    producer = p.worker._worker.producer
    drain, held = producer._inbox.drain, [True]
    producer._inbox.drain = lambda: [] if held[0] else drain()  # the producer answers when told
    rng = random.Random(14)
    prompt = [rng.randrange(1000) for _ in range(PROMPT)]  # 3 blocks
    params = prefill(p, "p-1", prompt)
    src_bytes = [p.block_bytes(s) for s in params["remote_block_ids"]]
    local = d.add("local", [rng.randrange(1000) for _ in range(48)], 40)  # 3 blocks, growing to 6
    d.step()
    d.add("d-1", prompt, 2, params)
    d.step()  # the pull is out; d-1 holds its 3 blocks
    waiting = d.scheduler.requests["d-1"]
    assert waiting.status.name == "WAITING_FOR_REMOTE_KVS"
    held_blocks = d.blocks("d-1")
    run(d, until=lambda: local.num_preemptions > 0, seconds=10)
    assert waiting.status.name == "WAITING_FOR_REMOTE_KVS" and d.blocks("d-1") == held_blocks
    held[0] = False
    run(p, d, until=lambda: all(r in d.outputs and d.outputs[r].finished for r in ("d-1", "local")), seconds=15)
    assert d.outputs["d-1"].finish_reason.name == "LENGTH" and d.outputs["local"].finish_reason.name == "LENGTH"
    assert [d.block_bytes(b) for b in held_blocks] == src_bytes
    assert not d.load_errors
    run(p, d, until=lambda: p.free_blocks() == FREE and d.free_blocks() == 7)
