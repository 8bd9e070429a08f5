"""CUDA memory handles for the agent, through the driver API (ctypes; no toolkit needed).

The allocation that holds a pointer (for PyTorch: the caching allocator's segment) is
exported as a legacy IPC handle; the region is the offset of the pointer in it. PyTorch
with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) maps memory
with the VMM API, which has no legacy IPC handle: turn that off for registered tensors.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Sequence, Tuple

from . import errors

_lib: Optional[ctypes.CDLL] = None


def _driver() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise errors.FailedPrecondition(f"no CUDA driver in this process: {e}") from None
        _check(lib, lib.cuInit(0), "cuInit")
        _lib = lib
    return _lib


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise errors.InvalidArgument(f"{what} failed: {(name.value or b'?').decode()}")


def _use_device(lib: ctypes.CDLL, device: int) -> ctypes.c_int:
    """Makes ``device``'s primary context current on this thread; returns the CUdevice."""
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def _pci_bus_id(lib: ctypes.CDLL, dev: ctypes.c_int) -> str:
    bus = ctypes.create_string_buffer(32)
    _check(lib, lib.cuDeviceGetPCIBusId(bus, 32, dev), "cuDeviceGetPCIBusId")
    return bus.value.decode().lower()


def ipc_handle(ptr: int, device: int) -> Tuple[bytes, int, str]:
    """(64-byte IPC handle of the allocation holding ``ptr``, offset of ``ptr`` in it, PCI bus id)."""
    lib = _driver()
    dev = _use_device(lib, device)
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    _check(lib, lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
           "cuMemGetAddressRange (is the pointer device memory?)")
    handle = (ctypes.c_char * 64)()
    _check(lib, lib.cuIpcGetMemHandle(handle, base),
           "cuIpcGetMemHandle (memory from cudaMalloc is needed; not VMM / expandable segments)")
    return bytes(handle), ptr - base.value, _pci_bus_id(lib, dev)


# ---------------------------------------------------------------- exportable allocations

class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _POSIX_FD, _LOCATION_DEVICE, _READWRITE = 1, 1, 1, 3
_buffers = {}  # ptr -> DeviceBuffer, for register_cuda to find the allocation of a tensor


class DeviceBuffer:
    """GPU memory from cuMemCreate, exportable as a POSIX fd: the handle kind that needs
    nothing shared between pods, and that the agent maps so every GPU can reach it (its
    gather/scatter kernel then serves copies between GPUs). Exposes
    ``__cuda_array_interface__``; see empty() for a PyTorch tensor over it."""

    def __init__(self, size: int, device: int):
        lib = _driver()
        dev = _use_device(lib, device)
        prop = _AllocationProp(type=_PINNED, requestedHandleTypes=_POSIX_FD,
                               location=_Location(_LOCATION_DEVICE, device))
        gran = ctypes.c_size_t()
        _check(lib, lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
               "cuMemGetAllocationGranularity")
        self.size = (size + gran.value - 1) // gran.value * gran.value
        self.device = device
        self._lib = lib
        self._handle = ctypes.c_uint64()
        self._fd = -1
        _check(lib, lib.cuMemCreate(ctypes.byref(self._handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                                    ctypes.c_uint64(0)), "cuMemCreate")
        ptr = ctypes.c_uint64()
        _check(lib, lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.size), gran,
                                            ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        self.ptr = ptr.value
        _check(lib, lib.cuMemMap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                 self._handle, ctypes.c_uint64(0)), "cuMemMap")
        access = _AccessDesc(_Location(_LOCATION_DEVICE, device), _READWRITE)
        _check(lib, lib.cuMemSetAccess(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size), ctypes.byref(access),
                                       ctypes.c_size_t(1)), "cuMemSetAccess")
        self.pci_bus_id = _pci_bus_id(lib, dev)
        _buffers[self.ptr] = self

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}

    def export_fd(self) -> int:
        """The allocation's POSIX fd (made once, owned by the buffer)."""
        if self._fd < 0:
            fd = ctypes.c_int()
            _check(self._lib, self._lib.cuMemExportToShareableHandle(ctypes.byref(fd), self._handle, _POSIX_FD,
                                                                     ctypes.c_uint64(0)),
                   "cuMemExportToShareableHandle")
            self._fd = fd.value
        return self._fd

    def close(self) -> None:
        """Frees the memory (an agent that imported it keeps it until its regions go)."""
        if self.ptr:
            _buffers.pop(self.ptr, None)
            self._lib.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            self._lib.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            self._lib.cuMemRelease(self._handle)
            self.ptr = 0
        if self._fd >= 0:
            import os

            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def find_buffer(ptr: int) -> Optional["DeviceBuffer"]:
    """The DeviceBuffer holding ``ptr``, or None."""
    for base, buf in _buffers.items():
        if base <= ptr < base + buf.size:
            return buf
    return None


def empty(shape: Sequence[int], dtype: Any, device: int = 0) -> Any:
    """A PyTorch tensor over a new DeviceBuffer (uninitialized), for memory that pods
    register with ferry: Client.register_cuda then passes its fd rather than an IPC
    handle. The buffer lives as long as the tensor (and its views)."""
    import math

    import torch

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buf = DeviceBuffer(nbytes, device)
    flat = torch.as_tensor(buf, device=f"cuda:{device}")
    t = flat[:nbytes].view(dtype).view(*shape)
    t._ferry_buffer = buf  # keeps the memory alive with the tensor
    return t
