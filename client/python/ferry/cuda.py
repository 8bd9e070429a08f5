"""CUDA memory handles for the agent, through the driver API (ctypes; no toolkit needed).

The allocation that holds a pointer (for PyTorch: the caching allocator's segment) is
exported as a legacy IPC handle; the region is the offset of the pointer in it. PyTorch
with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) maps memory
with the VMM API, which has no legacy IPC handle: turn that off for registered tensors.
"""
from __future__ import annotations

import ctypes
from typing import Tuple

from . import errors

_lib = None


def _driver():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise errors.FailedPrecondition(f"no CUDA driver in this process: {e}") from None
        _check(lib, lib.cuInit(0), "cuInit")
        _lib = lib
    return _lib


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise errors.InvalidArgument(f"{what} failed: {(name.value or b'?').decode()}")


def ipc_handle(ptr: int, device: int) -> Tuple[bytes, int, str]:
    """(64-byte IPC handle of the allocation holding ``ptr``, offset of ``ptr`` in it, PCI bus id)."""
    lib = _driver()
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    _check(lib, lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
           "cuMemGetAddressRange (is the pointer device memory?)")
    handle = (ctypes.c_char * 64)()
    _check(lib, lib.cuIpcGetMemHandle(handle, base),
           "cuIpcGetMemHandle (memory from cudaMalloc is needed; not VMM / expandable segments)")
    bus = ctypes.create_string_buffer(32)
    _check(lib, lib.cuDeviceGetPCIBusId(bus, 32, dev), "cuDeviceGetPCIBusId")
    return bytes(handle), ptr - base.value, bus.value.decode().lower()
