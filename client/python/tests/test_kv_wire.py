"""ferry.kv_handoff.wire: each handoff message decodes to what was encoded, splits to fit a
message, and a malformed one raises instead of decoding to something else."""
import array
import struct

import pytest

from ferry.kv_handoff import wire


def test_messages_decode_to_what_was_encoded():
    hello = wire.Hello("decode-0.ab", 48, 4096, 2, 0, 3, [b"d0", b"d1", b"d22"], features=5)
    assert wire.Hello.decode(hello.encode()) == hello
    pull = wire.Pull("decode-0.ab", "req-1", 2, 4, 1, array.array("I", [7, 8, 9]), "mine-1", b"s" * 16)
    assert wire.Pull.decode(pull.encode()) == pull
    cancel = wire.Cancel("decode-0.ab", "req-1", "mine-1", b"s" * 16)
    assert wire.Cancel.decode(cancel.encode()) == cancel
    kind, body = wire.parse(wire.frame(wire.PULL, pull.encode()))
    assert (kind, wire.Pull.decode(body)) == (wire.PULL, pull)
    assert wire.requested(wire.frame(wire.CANCEL, cancel.encode())) == "req-1"
    assert wire.requested(wire.frame(wire.HELLO, hello.encode())) is None
    assert wire.unpack_names(wire.names_payload([b"a", b"bc"])) == ["a", "bc"]
    assert wire.unpack_names(wire.names_payload([b"only"])) == ["only"]


def test_messages_from_older_consumers_decode_with_defaults():
    hello = wire.Hello("c", 1, 2, 2, 0, 1, [b"d"])
    assert wire.Hello.decode(hello.encode()[:-4]).features == 0  # before features
    pull = wire.Pull("c", "r", 0, 1, 0, array.array("I", [1]), "r", b"")
    assert wire.Pull.decode(pull.encode()[:-1]).secret == b""  # before secrets


def test_long_messages_split_to_fit_and_together_carry_everything():
    ids = array.array("I", range(3000))
    pulls = wire.Pull.split("c", "r", 1, ids, "r", b"s" * 16)
    assert len(pulls) > 1 and all(len(wire.frame(wire.PULL, p.encode())) <= wire.MAX_PAYLOAD for p in pulls)
    assert array.array("I", [i for p in pulls for i in p.ids]) == ids
    assert [p.first for p in pulls] == [sum(len(q.ids) for q in pulls[:i]) for i in range(len(pulls))]
    assert len(wire.Pull.split("c", "r", 5, array.array("I"), "r", b"")) == 1  # every block cached: one PULL
    hellos = wire.Hello.split("c", 8, 4096, 2, [bytes(300)] * 40)
    assert len(hellos) > 1 and sum(len(h.descriptors) for h in hellos) == 40
    assert all(len(wire.frame(wire.HELLO, h.encode())) <= wire.MAX_PAYLOAD for h in hellos)


def test_malformed_messages_raise():
    with pytest.raises(ValueError, match="not a ferry KV handoff message"):
        wire.parse(b"FYK")
    pull = wire.Pull("c", "r", 0, 9, 0, array.array("I", [1, 2]), "r", b"").encode()
    forged = pull[:-4] + struct.pack("<I", 1000)  # claims more ids than the message holds
    for body in (pull[:5], forged[:20]):
        with pytest.raises(struct.error):
            wire.Pull.decode(body)
    with pytest.raises(ValueError, match="exceeds 4096"):
        wire.frame(wire.PULL, bytes(4096))
