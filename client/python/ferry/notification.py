"""What a session receives: a notified write that ended, or a message (client.notifications()
and the inbox both yield these)."""
from __future__ import annotations

import builtins
import dataclasses

from ._proto import ferry_pb2


@dataclasses.dataclass(frozen=True)
class Notification:
    region_id: int  # the receiving region (this client's)
    tag: int
    transfer_id: int  # 0 for a message
    bytes: int  # bytes written; 0 for a message
    source_incarnation: int
    payload: builtins.bytes = b""  # the writer's notify_payload, or the message's payload
    # "write" (a notified write ended), "message" (send_message), or "window_refused" (a
    # write into a region in window mode was refused, nothing of it written; tag is the
    # window's id, 0 for a write that named no window; message says why).
    kind: str = "write"
    # A write's outcome: code 0 when every byte landed; otherwise (a google.rpc code) it
    # failed after it started, and some of its bytes may be in the region.
    code: int = 0
    message: str = ""
    # How many of this session's notifications the agent dropped just before this one
    # (its queue was full: the client read too slowly); 0 normally.
    lost_before: int = 0

    @property
    def ok(self) -> bool:
        return self.code == 0


_KINDS = {ferry_pb2.NOTIFICATION_KIND_MESSAGE: "message",
          ferry_pb2.NOTIFICATION_KIND_WINDOW_REFUSED: "window_refused"}


def _notification(n: ferry_pb2.Notification) -> Notification:
    kind = _KINDS.get(n.kind, "write")
    return Notification(n.region_id, n.tag, n.transfer_id, n.bytes, n.source_incarnation, n.payload, kind, n.code,
                        n.message, n.lost_before)
