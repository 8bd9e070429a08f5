"""Host memory an agent can map: PyTorch CPU tensors over a memfd.

An agent reaches a pod's host memory only through a file descriptor (sent on the session
socket), so memory from malloc or PyTorch's CPU allocator cannot be registered. Tensors
made here can: ``Client.register_tensor`` sends their buffer's fd.

    t = ferry.host.empty((2, 1024, 16, 8, 128), torch.bfloat16)   # shareable CPU tensor
    region = client.register_tensor(t)
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import weakref
from typing import Any, Dict, Optional, Sequence

_buffers: Dict[int, "HostBuffer"] = {}  # base address -> buffer


class HostBuffer:
    """``size`` bytes of a memfd mapped into this process (zero-filled)."""

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError(f"size must be at least 1 byte, got {size}")
        self.size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        self.fd = os.memfd_create("ferry-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)  # the agent seals it
        os.ftruncate(self.fd, self.size)
        self.mapping = mmap.mmap(self.fd, self.size)
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mapping))
        _buffers[self.ptr] = self
        # The mapping lives until the last view of it goes; the fd and the entry go with the buffer.
        weakref.finalize(self, _forget, self.ptr, self.fd)


def _forget(ptr: int, fd: int) -> None:
    _buffers.pop(ptr, None)
    os.close(fd)


def find_buffer(ptr: int) -> Optional[HostBuffer]:
    """The HostBuffer holding ``ptr``, or None."""
    for base, buf in _buffers.items():
        if base <= ptr < base + buf.size:
            return buf
    return None


def empty(shape: Sequence[int], dtype: Any) -> Any:
    """A PyTorch CPU tensor over a new HostBuffer (zero-filled). The buffer lives as long
    as the tensor and its views."""
    import torch

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buf = HostBuffer(nbytes)
    t = torch.frombuffer(buf.mapping, dtype=torch.uint8, count=nbytes).view(dtype).view(*shape)
    t._ferry_buffer = buf
    return t
