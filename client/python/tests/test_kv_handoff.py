"""ferry.kv_handoff between two live agents (host memory): a producer's held blocks
pushed into a consumer's KV cache, byte for byte, and every way a handoff can fail."""
import array
import os
import random
import time

import pytest

import ferry
from ferry.kv_handoff import KVCacheSpec, KVConsumer, KVProducer, PullRequest, wire

LAYERS, BLOCK = 4, 4096
S = b"request-secret-1"  # every request's secret here (KVProducer.hold); tests of secrets make their own


def until(*sides, seconds=10.0):
    """Polls every side until one reports something; returns their Progress in order."""
    deadline = time.monotonic() + seconds
    seen = [ferry.kv_handoff.Progress() for _ in sides]
    while time.monotonic() < deadline:
        for acc, side in zip(seen, sides, strict=False):
            p = side.poll()
            acc.done |= p.done
            acc.failed.update(p.failed)
        if all(acc.done or acc.failed for acc in seen):
            return seen
        time.sleep(0.01)
    return seen


@pytest.fixture
def pair(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        pspec, cspec = KVCacheSpec(num_blocks=64, block_bytes=BLOCK), KVCacheSpec(num_blocks=48, block_bytes=BLOCK)
        players = [ca.register_host(pspec.region_bytes) for _ in range(LAYERS)]
        clayers = [cb.register_host(cspec.region_bytes) for _ in range(LAYERS)]
        for r in players:
            r.buffer[:] = os.urandom(r.size)
        producer = KVProducer(ca, pspec, players, "prefill-0")
        consumer = KVConsumer(cb, cspec, clayers, "decode-0", timeout=5.0)
        yield producer, consumer, players, clayers, pspec, cspec
        producer.close()
        consumer.close()


def block(region, spec, half, i):
    at = half * spec.num_blocks * BLOCK + i * BLOCK
    return bytes(region.buffer[at:at + BLOCK])


def test_one_request_lands_in_every_layer_and_both_sides_hear_of_it(pair, monkeypatch):
    producer, consumer, players, clayers, pspec, cspec = pair
    # The consumer's HELLO and PULL go as message entries of a write queue, not by RPC.
    monkeypatch.setattr(consumer._client, "send_message", lambda *a, **k: pytest.fail("a message by RPC"))
    src, dst = random.Random(1).sample(range(64), 10), random.Random(2).sample(range(48), 10)
    producer.hold("req-1", src, secret=S)
    consumer.pull("req-1", producer.mailbox, dst, secret=S)
    p, c = until(producer, consumer)
    assert (p.done, p.failed, c.done, c.failed) == ({"req-1"}, {}, {"req-1"}, {})
    assert [q is not None for q in producer._queues.values()] == [True]  # as a write queue's batch entry
    for layer in range(LAYERS):
        for half in (0, 1):
            for s, d in zip(src, dst, strict=False):
                assert block(clayers[layer], cspec, half, d) == block(players[layer], pspec, half, s)


def test_a_pull_to_a_mailbox_that_is_gone_fails_on_the_consumer(pair):
    producer, consumer, players, clayers, pspec, cspec = pair
    producer.hold("req-8", [5], secret=S)
    consumer.pull("req-8", producer.mailbox, [6], secret=S)  # the consumer's queue to the mailbox is made here
    assert until(producer, consumer)[1].done == {"req-8"}
    producer.hold("req-9", [1, 2], secret=S)
    producer._mailbox_region.deregister()
    consumer.pull("req-9", producer.mailbox, [3, 4], secret=S)  # queued: the refusal comes back through poll()
    (c,) = until(consumer)
    assert not c.done and "asking the producer failed" in c.failed["req-9"] and "not registered" in c.failed["req-9"]
    for layer in range(LAYERS):
        assert block(clayers[layer], cspec, 0, 3) == bytes(BLOCK)  # nothing written


def test_a_producer_gone_after_the_pull_fails_its_requests_within_seconds(pair):
    # Before, a consumer whose producer died after reading its pull (before any write
    # began) heard nothing until its own timeout. It now PINGs a producer it waits on.
    producer, consumer, players, clayers, pspec, cspec = pair
    producer.hold("req-1", [5], secret=S)
    producer._stopping.set()  # the responder stops answering, as a pod that froze and died
    consumer.pull("req-1", producer.mailbox, [6], secret=S)
    time.sleep(0.3)  # the pull was delivered
    producer._mailbox_region.deregister()  # the pod's session ended: its mailbox is gone
    t0 = time.monotonic()
    (c,) = until(consumer)
    assert "the producer's mailbox is gone" in c.failed["req-1"]
    assert time.monotonic() - t0 < 3  # not the consumer's 5 s timeout


def test_a_write_the_queue_cannot_take_goes_by_write_batch(pair, monkeypatch):
    producer, consumer, players, clayers, pspec, cspec = pair
    monkeypatch.setattr(ferry.kv_handoff.producer._ConsumerQueue, "post", lambda *args: False)  # as if full
    src, dst = random.Random(3).sample(range(64), 7), random.Random(4).sample(range(48), 7)
    producer.hold("req-2", src, secret=S)
    consumer.pull("req-2", producer.mailbox, dst, secret=S)
    p, c = until(producer, consumer)
    assert (p.done, p.failed, c.done, c.failed) == ({"req-2"}, {}, {"req-2"}, {})
    for layer in range(LAYERS):
        for half in (0, 1):
            for s, d in zip(src, dst, strict=False):
                assert block(clayers[layer], cspec, half, d) == block(players[layer], pspec, half, s)


def test_eight_concurrent_requests_and_a_partial_prefix_hit(pair):
    producer, consumer, players, clayers, pspec, cspec = pair
    for layer in clayers:
        layer.buffer[:] = bytes(layer.size)
    for r in range(8):  # request r: producer blocks 8r..8r+3 into consumer blocks 4r..4r+3
        producer.hold(f"r{r}", list(range(8 * r, 8 * r + 4)), secret=S)
    for r in range(8):
        skip = 2 if r == 7 else 0  # r7: the consumer has its first two blocks cached
        consumer.pull(f"r{r}", producer.mailbox, list(range(4 * r + skip, 4 * r + 4)), skip=skip, secret=S)
    want = {f"r{r}" for r in range(8)}
    got_p, got_c = set(), set()
    deadline = time.monotonic() + 15
    while (got_p != want or got_c != want) and time.monotonic() < deadline:
        pp, cc = producer.poll(), consumer.poll()
        assert not pp.failed and not cc.failed, (pp.failed, cc.failed)
        got_p |= pp.done
        got_c |= cc.done
        time.sleep(0.01)
    assert got_p == want and got_c == want
    for r in range(8):
        for i in range(4):
            moved = not (r == 7 and i < 2)
            expect = block(players[2], pspec, 1, 8 * r + i) if moved else bytes(BLOCK)
            assert block(clayers[2], cspec, 1, 4 * r + i) == expect


@pytest.mark.parametrize("most_blocks, features, writes", [
    (256, 1, [["s0", "s1", "s2", "s4", "s5"]]),
    (4, 1, [["s0", "s1"], ["s2", "s4"], ["s5"]]),  # at most 4 blocks a write: one more request would pass it
    (256, 0, [["s0"], ["s1"], ["s2"], ["s4"], ["s5"]]),  # a consumer from before shared writes
])
def test_a_steps_pulls_share_one_write_and_a_cancel_among_them_drops_only_its_own(pair, monkeypatch, most_blocks,
                                                                                  features, writes):
    # A producer that answers in poll() reads a decode step's messages in one pass: the
    # valid pulls go as one write whose notification names each request; a cancel read
    # in the same pass drops its request before the write; a bad pull is refused alone.
    producer, consumer, players, clayers, pspec, cspec = pair
    monkeypatch.setattr(ferry.kv_handoff.producer, "_MERGED_BLOCKS", most_blocks)
    monkeypatch.setattr(ferry.kv_handoff.consumer, "_FEATURES", features)  # what the consumer's HELLO says
    for layer in clayers:
        layer.buffer[:] = bytes(layer.size)
    posts, post = [], ferry.kv_handoff.producer._ConsumerQueue.post
    monkeypatch.setattr(ferry.kv_handoff.producer._ConsumerQueue, "post",
                        lambda q, rids, *a: posts.append(list(rids)) or post(q, rids, *a))
    stepwise = KVProducer(producer._client, pspec, players, "prefill-step", background=False)
    try:
        for r in range(6):
            stepwise.hold(f"s{r}", [10 + r, 20 + r], secret=S)
        for r in range(6):
            consumer.pull(f"s{r}", stepwise.mailbox, [2 * r, 2 * r + 1], secret=S)
        assert not consumer.cancel("s3", stepwise.mailbox, secret=S)  # pulled: the producer's answer settles it
        consumer.pull("s9", stepwise.mailbox, [40], secret=S)  # never held
        mailbox, deadline = consumer._mailboxes[stepwise.mailbox], time.monotonic() + 10
        while mailbox._sent and time.monotonic() < deadline:  # every message is in the mailbox
            mailbox._reap(0.05)
        assert not mailbox._sent
        want = {f"s{r}" for r in (0, 1, 2, 4, 5)}
        p, c = ferry.kv_handoff.Progress(), ferry.kv_handoff.Progress()
        while (p.done != want or c.done != want or len(c.failed) < 2) and time.monotonic() < deadline:
            for acc, side in ((p, stepwise), (c, consumer)):
                got = side.poll()
                acc.done |= got.done
                acc.failed.update(got.failed)
            time.sleep(0.01)
        assert posts == writes
        assert (p.done, c.done) == (want, want)
        assert set(p.failed) == {"s3"} and "cancelled" in p.failed["s3"]
        assert c.failed["s3"] == "cancelled" and "not held" in c.failed["s9"] and set(c.failed) == {"s3", "s9"}
        for layer, target in zip(players, clayers, strict=False):
            for half in (0, 1):
                for r in range(6):
                    for i, src in enumerate((10 + r, 20 + r)):
                        expect = bytes(BLOCK) if r == 3 else block(layer, pspec, half, src)
                        assert block(target, cspec, half, 2 * r + i) == expect
                assert block(target, cspec, half, 40) == bytes(BLOCK)
    finally:
        stepwise.close()


def test_pulls_read_together_that_name_one_destination_block_are_written_apart(pair, monkeypatch):
    # Two pulls read in one pass name destination block 21 both (a write may fill a block
    # once): they go as two writes, in order, as before pulls shared writes.
    producer, consumer, players, clayers, pspec, cspec = pair
    posts, post = [], ferry.kv_handoff.producer._ConsumerQueue.post
    monkeypatch.setattr(ferry.kv_handoff.producer._ConsumerQueue, "post",
                        lambda q, rids, *a: posts.append(list(rids)) or post(q, rids, *a))
    stepwise = KVProducer(producer._client, pspec, players, "prefill-step", background=False)
    try:
        for rid, src in (("x1", [1, 2]), ("x2", [3, 4]), ("x3", [5])):
            stepwise.hold(rid, src, secret=S)
        for rid, dst in (("x1", [20, 21]), ("x2", [21, 22]), ("x3", [23])):
            consumer.pull(rid, stepwise.mailbox, dst, secret=S)
        mailbox, deadline = consumer._mailboxes[stepwise.mailbox], time.monotonic() + 10
        while mailbox._sent and time.monotonic() < deadline:  # every pull is in the mailbox
            mailbox._reap(0.05)
        want, p, c = {"x1", "x2", "x3"}, ferry.kv_handoff.Progress(), ferry.kv_handoff.Progress()
        while (p.done != want or c.done != want) and time.monotonic() < deadline:
            for acc, side in ((p, stepwise), (c, consumer)):
                got = side.poll()
                acc.done |= got.done
                acc.failed.update(got.failed)
            time.sleep(0.01)
        assert (p.done, c.done, p.failed, c.failed) == (want, want, {}, {})
        assert posts == [["x1"], ["x2", "x3"]]
        for layer, target in zip(players, clayers, strict=False):
            assert block(target, cspec, 0, 20) == block(layer, pspec, 0, 1)
            assert block(target, cspec, 0, 21) in (block(layer, pspec, 0, 2), block(layer, pspec, 0, 3))
            assert block(target, cspec, 0, 22) == block(layer, pspec, 0, 4)
            assert block(target, cspec, 0, 23) == block(layer, pspec, 0, 5)
    finally:
        stepwise.close()


def test_a_write_the_agent_refuses_is_reported_to_the_consumer_at_once(pair):
    # A pull naming one destination block twice passes both clients' checks; the agent
    # refuses the write, and the producer tells the consumer rather than letting it wait
    # for its timeout.
    producer, consumer, players, clayers, pspec, cspec = pair
    before = [bytes(r.buffer) for r in clayers]
    producer.hold("twice", [1, 2], secret=S)
    consumer.pull("twice", producer.mailbox, [30, 30], secret=S)
    started = time.monotonic()
    p, c = until(producer, consumer)
    assert "block 30 appears twice" in p.failed["twice"] and "block 30 appears twice" in c.failed["twice"]
    assert time.monotonic() - started < consumer._timeout
    assert [bytes(r.buffer) for r in clayers] == before


def test_refusals_reach_both_sides_and_nothing_is_written(pair):
    producer, consumer, players, clayers, pspec, cspec = pair
    before = [bytes(r.buffer) for r in clayers]
    # Garbage in the mailbox: refused, attributed to no request.
    consumer._client.send_message(producer.mailbox, b"not a handoff message")
    # A pull for a request the producer never held, and one with the wrong block count.
    producer.hold("held", [1, 2, 3], secret=S)
    consumer.pull("unknown", producer.mailbox, [0], secret=S)
    p, c = until(producer, consumer)
    assert "" in p.failed and "not a ferry" in p.failed[""]
    assert "not held" in c.failed["unknown"]
    consumer.pull("held", producer.mailbox, [0, 1], secret=S)
    p, c = until(producer, consumer)
    assert "3" in p.failed["held"] and "held" in c.failed
    assert [bytes(r.buffer) for r in clayers] == before


def test_block_ids_out_of_range_are_named_on_both_sides(pair):
    producer, consumer, _, clayers, pspec, cspec = pair
    for bad in (pspec.num_blocks, -1, 2**40):
        with pytest.raises(ValueError, match=f"block id {bad} is outside 0..{pspec.num_blocks - 1}"):
            producer.hold("bad", [0, bad], secret=S)
    with pytest.raises(ValueError, match=f"block id {cspec.num_blocks} is outside 0..{cspec.num_blocks - 1}"):
        consumer.pull("bad", producer.mailbox, [1, cspec.num_blocks], secret=S)
    # A pull that passed no consumer-side check (sent by hand after a HELLO) asks for a
    # block past the consumer's cache: the producer refuses it, nothing is written.
    before = [bytes(r.buffer) for r in clayers]
    producer.hold("first", [1], secret=S)
    consumer.pull("first", producer.mailbox, [2], secret=S)
    assert until(producer, consumer)[1].done == {"first"}
    producer.hold("forged", [3, 4], secret=S)
    forged = wire.Pull(consumer._wire_name, "forged", 0, 2, 0, array.array("I", [5, cspec.num_blocks]), "forged", S)
    consumer._client.send_message(producer.mailbox, wire.frame(wire.PULL, forged.encode()))
    (p,) = until(producer)
    assert f"destination block id {cspec.num_blocks} is outside the consumer's" in p.failed["forged"]
    for r, old in zip(clayers, before, strict=False):  # block 5 of every layer half, where "forged" would have gone
        assert all(block(r, cspec, h, 5) == old[(h * cspec.num_blocks + 5) * BLOCK:][:BLOCK] for h in (0, 1))


def test_a_hello_claiming_more_blocks_than_its_regions_hold_is_refused_and_the_producer_goes_on(pair, fabric_agents):
    # A hostile pod's HELLO: 2**63 blocks over regions of a few. Before, the producer took
    # it, its write's offsets overflowed, and the exception killed its responder thread
    # (or came out of poll() into the engine), leaving the request held for good.
    producer, consumer, players, clayers, pspec, cspec = pair
    with ferry.Client(fabric_agents[1].socket) as cc:
        small = [cc.register_host(cspec.region_bytes) for _ in range(LAYERS)]
        evil = KVConsumer(cc, cspec, small, "evil", timeout=1.0)
        evil._spec = KVCacheSpec(num_blocks=2**63, block_bytes=BLOCK)  # past the constructor's own check
        producer.hold("victim-of-evil", [1, 2], secret=S)
        evil.pull("victim-of-evil", producer.mailbox, [3, 4], secret=S)
        (p,) = until(producer)
        assert "'s HELLO claims 9223372036854775808 blocks" in p.failed[""] and "consumer evil#" in p.failed[""]
        # Its pull is refused and the held request let go; the producer has no descriptor
        # of a consumer whose HELLO it refused to answer to: that one waits for its timeout.
        if "victim-of-evil" not in p.failed:
            p = until(producer)[0]
        assert "not introduced itself" in p.failed["victim-of-evil"]
        assert producer._responder.is_alive()
        # The producer still answers an honest consumer.
        producer.hold("after", [5], secret=S)
        consumer.pull("after", producer.mailbox, [6], secret=S)
        p, c = until(producer, consumer)
        assert "after" in p.done and c.done == {"after"}
        assert block(clayers[0], cspec, 0, 6) == block(players[0], pspec, 0, 5)
        evil.close()


def test_only_the_request_secret_pulls_or_cancels_and_a_hello_cannot_take_a_consumers_name(pair, fabric_agents):
    # Before, any pod holding the producer's mailbox descriptor (it travels in
    # kv_transfer_params) could PULL another consumer's request into its own regions,
    # CANCEL it, or HELLO under that consumer's name and receive its later requests.
    producer, consumer, players, clayers, pspec, cspec = pair
    secret = producer.hold("victim", [1, 2])  # a fresh random secret
    with ferry.Client(fabric_agents[1].socket) as cc:
        regions = [cc.register_host(cspec.region_bytes) for _ in range(LAYERS)]
        thief = KVConsumer(cc, cspec, regions, "decode-0", timeout=1.0)  # the victim's engine id, too
        before = [bytes(r.buffer) for r in regions]
        thief.pull("victim", producer.mailbox, [3, 4])  # no secret
        thief.pull("victim", producer.mailbox, [3, 4], secret=bytes(16))  # a guessed one
        thief.cancel("victim", producer.mailbox, secret=S)  # another request's secret
        (p,) = until(producer)
        assert "without the request's secret was refused" in p.failed[""]
        assert "victim" not in p.failed and "victim" not in p.done  # still held for its consumer
        # The honest consumer, whose engine id the thief also used, gets its blocks.
        consumer.pull("victim", producer.mailbox, [7, 8], secret=secret)
        p, c = until(producer, consumer)
        assert "victim" in p.done and c.done == {"victim"}
        assert block(clayers[0], cspec, 1, 8) == block(players[0], pspec, 1, 2)
        assert [bytes(r.buffer) for r in regions] == before  # nothing reached the thief
        thief.close()


def test_a_flood_of_pulls_for_requests_that_do_not_exist_delays_no_honest_pull(pair, fabric_agents):
    # Before, the producer's responder stopped at the first pull of a request it did not
    # hold (it may come before its hold) and left everything after it for the engine's
    # next poll(), which answered each junk pull with a message of its own: a flood of
    # 20k delayed the next honest handoff to 1.1 s.
    producer, consumer, players, clayers, pspec, cspec = pair
    with ferry.Client(fabric_agents[1].socket) as cc:
        regions = [cc.register_host(cspec.region_bytes) for _ in range(LAYERS)]
        flooder = KVConsumer(cc, cspec, regions, "flooder", timeout=30.0)
        for i in range(2000):
            flooder.pull(f"junk-{i}", producer.mailbox, [1], secret=S)
        time.sleep(0.5)  # the responder has read (and set aside) what the agent let through
        producer.hold("honest", [4, 5], secret=S)
        started = time.monotonic()
        consumer.pull("honest", producer.mailbox, [6, 7], secret=S)
        (c,) = until(consumer, seconds=5)  # the producer is not polled: its responder answers
        took = time.monotonic() - started
        assert c.done == {"honest"}, c.failed
        assert took < 1.0, f"the honest pull took {took:.2f} s behind the junk"
        assert block(clayers[0], cspec, 1, 7) == block(players[0], pspec, 1, 5)
        started = time.monotonic()
        (p,) = until(producer)  # the junk, refused at a bounded rate: the engine's poll stays short
        assert "honest" in p.done
        assert time.monotonic() - started < 2.0
        assert "were not sent" in p.failed.get("", ""), p.failed
        flooder.close()


def test_a_lease_expires_and_a_consumer_times_out(pair):
    producer, consumer, players, _, pspec, _ = pair
    producer.hold("nobody-pulls", [5], lease=0.2, secret=S)
    (p,) = until(producer)
    assert "lease expired" in p.failed["nobody-pulls"]
    consumer._timeout = 0.3
    silent = KVProducer(producer._client, pspec, players, "prefill-silent", background=False)  # answers in poll()
    silent.hold("never-answered", [6], secret=S)
    consumer.pull("never-answered", silent.mailbox, [7], secret=S)  # and it is never polled
    (c,) = until(consumer)
    assert "nothing heard" in c.failed["never-answered"]
    silent.close()


def test_the_producer_answers_a_pull_before_its_next_poll(pair):
    producer, consumer, players, clayers, pspec, cspec = pair
    producer.hold("eager", [9, 4], secret=S)
    consumer.pull("eager", producer.mailbox, [1, 2], secret=S)
    (c,) = until(consumer)  # only the consumer is polled: the producer's responder wrote
    assert c.done == {"eager"} and not c.failed
    for layer, target in zip(players, clayers, strict=False):
        for half in (0, 1):
            assert block(target, cspec, half, 1) == block(layer, pspec, half, 9)
            assert block(target, cspec, half, 2) == block(layer, pspec, half, 4)
    (p,) = until(producer)  # its next poll reports the write, and the blocks are free
    assert p.done == {"eager"} and producer.in_flight() == []


def test_a_pull_that_comes_before_the_hold_waits_for_it(pair):
    # A consumer can be faster than the producer engine's next step (which holds the
    # request): the producer's responder must not refuse the pull meanwhile.
    producer, consumer, players, clayers, pspec, cspec = pair
    consumer.pull("early", producer.mailbox, [3], secret=S)
    time.sleep(0.2)  # the responder has seen the pull
    producer.hold("early", [8], secret=S)
    p, c = until(producer, consumer)
    assert (p.done, c.done, p.failed, c.failed) == ({"early"}, {"early"}, {}, {})
    assert block(clayers[0], cspec, 1, 3) == block(players[0], pspec, 1, 8)


def test_cancel_before_and_after_the_write_and_ids_that_differ_per_side(pair):
    producer, consumer, players, clayers, pspec, cspec = pair
    # Not pulled yet: the producer lets the blocks go at once, nothing to wait for.
    producer.hold("p-1", [1, 2], secret=S)
    assert consumer.cancel("d-1", producer.mailbox, producer_request_id="p-1", secret=S)
    (p,) = until(producer)
    assert "cancelled" in p.failed["p-1"]
    # Pulled under the consumer's own id, then cancelled: the consumer hears the outcome
    # (here the write had started or the drop) under its id, reported as cancelled.
    producer.hold("p-2", [3, 4], secret=S)
    consumer.pull("d-2", producer.mailbox, [5, 6], producer_request_id="p-2", secret=S)
    assert not consumer.cancel("d-2", producer.mailbox, producer_request_id="p-2", secret=S)
    p, c = until(producer, consumer)
    assert c.failed == {"d-2": "cancelled"} and not c.done
    assert p.done == {"p-2"} or "cancelled" in p.failed["p-2"]
    # A pull under other ids lands where asked and is reported under the consumer's id.
    producer.hold("p-3", [7], secret=S)
    consumer.pull("d-3", producer.mailbox, [8], producer_request_id="p-3", secret=S)
    p, c = until(producer, consumer)
    assert (p.done, c.done) == ({"p-3"}, {"d-3"})
    assert block(clayers[0], cspec, 0, 8) == block(players[0], pspec, 0, 7)


def test_a_request_with_more_block_ids_than_one_message_holds(fabric_agents):
    a, b = fabric_agents
    spec = KVCacheSpec(num_blocks=3000, block_bytes=64)
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src_region, dst_region = ca.register_host(spec.region_bytes), cb.register_host(spec.region_bytes)
        src_region.buffer[:] = os.urandom(spec.region_bytes)
        producer = KVProducer(ca, spec, [src_region], "p")
        consumer = KVConsumer(cb, spec, [dst_region], "c", timeout=10.0)
        try:
            src, dst = random.Random(7).sample(range(3000), 2500), random.Random(8).sample(range(3000), 2500)
            producer.hold("long", src, secret=S)
            consumer.pull("long", producer.mailbox, dst[1:], skip=1, secret=S)  # 2,499 ids: three messages
            p, c = until(producer, consumer)
            assert (p.done, c.done) == ({"long"}, {"long"})
            half = spec.num_blocks * 64
            for h in (0, 1):
                for s_id, d_id in zip(src[1:], dst[1:], strict=False):
                    at_s, at_d = h * half + s_id * 64, h * half + d_id * 64
                    assert dst_region.buffer[at_d:at_d + 64] == src_region.buffer[at_s:at_s + 64]
        finally:
            producer.close()
            consumer.close()


def test_a_consumer_with_other_block_sizes_is_refused(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        producer = KVProducer(ca, KVCacheSpec(16, 4096), [ca.register_host(2 * 16 * 4096)], "p")
        consumer = KVConsumer(cb, KVCacheSpec(16, 8192), [cb.register_host(2 * 16 * 8192)], "c", timeout=2.0)
        try:
            producer.hold("r", [1], secret=S)
            consumer.pull("r", producer.mailbox, [1], secret=S)
            p, c = until(producer, consumer)
            assert "8192" in p.failed.get("", "") or "8192" in p.failed.get("r", "")
            assert "r" in c.failed
        finally:
            producer.close()
            consumer.close()


def test_one_client_as_producer_and_consumer_shares_its_inbox(agent):
    # vLLM's kv_both: both roles on one session, which has one notification inbox.
    with ferry.Client(agent.socket) as client:
        spec = KVCacheSpec(num_blocks=16, block_bytes=BLOCK)
        src = [client.register_host(spec.region_bytes) for _ in range(LAYERS)]
        dst = [client.register_host(spec.region_bytes) for _ in range(LAYERS)]
        for r in src:
            r.buffer[:] = os.urandom(r.size)
        producer = KVProducer(client, spec, src, "both-0")
        consumer = KVConsumer(client, spec, dst, "both-0", timeout=5.0)
        try:
            for i in range(3):
                producer.hold(f"r{i}", [i, i + 3], secret=S)
                consumer.pull(f"r{i}", producer.mailbox, [i + 8, i + 11], secret=S)
                p, c = until(producer, consumer)
                assert (p.done, c.done, p.failed, c.failed) == ({f"r{i}"}, {f"r{i}"}, {}, {})
                assert block(dst[1], spec, 1, i + 11) == block(src[1], spec, 1, i + 3)
        finally:
            producer.close()
            consumer.close()


@pytest.fixture
def windowed_pair(fabric_agents):
    """A consumer whose caches are in window mode (as FerryConnector registers them), and a
    producer that answers pulls only when polled (so a test decides when its write comes)."""
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        pspec, cspec = KVCacheSpec(num_blocks=64, block_bytes=BLOCK), KVCacheSpec(num_blocks=48, block_bytes=BLOCK)
        players = [ca.register_host(pspec.region_bytes) for _ in range(LAYERS)]
        clayers = [cb.register_host(cspec.region_bytes, write_windows=True) for _ in range(LAYERS)]
        for r in players:
            r.buffer[:] = os.urandom(r.size)
        producer = KVProducer(ca, pspec, players, "prefill-0", background=False)
        consumer = KVConsumer(cb, cspec, clayers, "decode-0", timeout=10.0)
        yield producer, consumer, players, clayers, pspec, cspec
        producer.close()
        consumer.close()


def test_through_windows_a_request_lands_and_its_window_closes(windowed_pair):
    producer, consumer, players, clayers, pspec, cspec = windowed_pair
    src, dst = random.Random(3).sample(range(64), 12), random.Random(4).sample(range(48), 12)
    producer.hold("req-w", src, secret=S)
    consumer.pull("req-w", producer.mailbox, dst, secret=S)
    assert set(consumer._windows) == {"req-w"}
    p, c = until(producer, consumer)
    assert (p.done, p.failed, c.done, c.failed) == ({"req-w"}, {}, {"req-w"}, {})
    assert consumer._windows == {}
    assert [q is not None for q in producer._queues.values()] == [True]  # a queue's batch entry, through the window
    for layer in range(LAYERS):
        for half in (0, 1):
            for s, d in zip(src, dst, strict=False):
                assert block(clayers[layer], cspec, half, d) == block(players[layer], pspec, half, s)


@pytest.mark.parametrize("windows", [True, False])
def test_a_write_after_the_consumer_timed_out_and_reused_its_blocks(fabric_agents, windows):
    """The consumer gives up on a request (its timeout), the engine hands the blocks to
    another request, and only then does the producer's write come. Through windows it is
    refused at the consumer's agent and the new owner's bytes stay; without them (caches
    registered as before) it lands in the reused blocks: the hazard the windows close."""
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        spec = KVCacheSpec(num_blocks=16, block_bytes=BLOCK)
        players = [ca.register_host(spec.region_bytes) for _ in range(LAYERS)]
        clayers = [cb.register_host(spec.region_bytes, write_windows=windows) for _ in range(LAYERS)]
        for r in players:
            r.buffer[:] = b"\xab" * r.size
        producer = KVProducer(ca, spec, players, "prefill-0", background=False)
        consumer = KVConsumer(cb, spec, clayers, "decode-0", timeout=0.3)
        try:
            producer.hold("late", [1, 2, 3], secret=S)
            consumer.pull("late", producer.mailbox, [5, 6, 7], secret=S)
            time.sleep(0.5)
            (c,) = until(consumer)
            assert "nothing heard" in c.failed["late"]
            for r in clayers:  # the engine reuses blocks 5..7 for another request
                r.buffer[:] = b"\x5a" * r.size
            (p,) = until(producer)
            intact = all(bytes(r.buffer) == b"\x5a" * r.size for r in clayers)
            if windows:
                assert "late" in p.failed and "write window" in p.failed["late"], p
                assert intact, "a late write landed in blocks the consumer had given up"
            else:
                assert p.done == {"late"}
                assert not intact
        finally:
            producer.close()
            consumer.close()


def test_a_steps_pulls_open_their_windows_together(windowed_pair, monkeypatch):
    """pull_many (what FerryConnector's worker calls per decode step): the windows of every
    pull are posted to the producer's queue before any is awaited; the requests share one
    write, each request's blocks through its own window; a pull that cannot be asked for
    fails alone, and every window is closed once its request is reported."""
    producer, consumer, players, clayers, pspec, cspec = windowed_pair
    posts, post = [], ferry.kv_handoff.producer._ConsumerQueue.post
    monkeypatch.setattr(ferry.kv_handoff.producer._ConsumerQueue, "post",
                        lambda q, rids, *a: posts.append((list(rids), [n for _, n in a[-1]])) or post(q, rids, *a))
    rng = random.Random(5)
    src = [rng.sample(range(64), 4) for _ in range(6)]
    dst = [list(range(8 * i, 8 * i + 4)) for i in range(6)]
    for i in range(6):
        producer.hold(f"m{i}", src[i], secret=S)
    pulls = [PullRequest(f"m{i}", producer.mailbox, dst[i], secret=S) for i in range(6)]
    pulls.append(PullRequest("bad", producer.mailbox, [48], secret=S))  # outside the consumer's 48 blocks
    failed = consumer.pull_many(pulls)
    assert list(failed) == ["bad"] and "outside 0..47" in str(failed["bad"]), failed
    assert set(consumer._windows) == {f"m{i}" for i in range(6)}
    p, c = until(producer, consumer)
    assert c.done == {f"m{i}" for i in range(6)} and not c.failed, c
    assert posts == [([f"m{i}" for i in range(6)], [4] * 6)]  # one write, a window span of 4 blocks each
    assert consumer._windows == {}
    for i in range(6):
        for s, d in zip(src[i], dst[i], strict=False):
            assert block(clayers[0], cspec, 1, d) == block(players[0], pspec, 1, s)


def test_a_cancel_through_a_window_settles_at_once(windowed_pair):
    producer, consumer, players, clayers, pspec, cspec = windowed_pair
    producer.hold("req-c", [1, 2], secret=S)
    consumer.pull("req-c", producer.mailbox, [3, 4], secret=S)
    assert consumer.cancel("req-c", producer.mailbox, secret=S) is True  # nothing can land any more
    before = [bytes(r.buffer) for r in clayers]
    (p,) = until(producer)
    assert "req-c" not in p.done
    assert [bytes(r.buffer) for r in clayers] == before


def test_a_slow_window_close_holds_its_request_back_but_not_the_step(windowed_pair, monkeypatch):
    """A request is reported once its window is closed (nothing can land in its blocks
    any more). A close the agent has not answered yet (a fault injected: its completion
    held back) does not block poll(): the request waits for a later poll, and others are
    reported meanwhile."""
    producer, consumer, players, clayers, pspec, cspec = windowed_pair
    held_back: set = set()
    window_entry = ferry.kv_handoff.consumer._Mailbox.window_entry

    def slow(mailbox, ud):
        return None if ud in held_back else window_entry(mailbox, ud)

    monkeypatch.setattr(ferry.kv_handoff.consumer._Mailbox, "window_entry", slow)
    post_close = ferry.kv_handoff.consumer._Mailbox.post_close_window

    def post_and_hold(mailbox, window_id, wait):  # the first close posted (the slow request's) is held back
        ud = post_close(mailbox, window_id, wait)
        if not posted:
            held_back.add(ud)
        posted.append(ud)
        return ud

    posted: list = []
    monkeypatch.setattr(ferry.kv_handoff.consumer._Mailbox, "post_close_window", post_and_hold)
    producer.hold("slow", [1, 2], secret=S)
    consumer.pull("slow", producer.mailbox, [3, 4], secret=S)
    (p,) = until(producer)
    assert p.done == {"slow"}
    t0 = time.monotonic()
    c = consumer.poll()
    assert time.monotonic() - t0 < 0.5 and not c.done and not c.failed, c
    assert set(consumer._closing) == {"slow"}
    producer.hold("quick", [5], secret=S)
    consumer.pull("quick", producer.mailbox, [6], secret=S)
    p, c = until(producer, consumer)
    assert c.done == {"quick"} and not c.failed, c  # not held up by the slow close
    held_back.clear()  # the agent answers
    (c,) = until(consumer)
    assert c.done == {"slow"} and consumer._closing == {}
