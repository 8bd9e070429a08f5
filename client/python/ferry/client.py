"""ferry.Client: a session with the node's ferry agent.

    import ferry

    with ferry.Client("/run/ferry/ferry.sock") as client:
        with client.register_host(1 << 20) as region:      # memfd-backed, shared with the agent
            region.buffer[:5] = b"hello"
            wire = region.descriptor()                      # bytes: hand to another pod
            ...
        # in the other pod:
        dst = ferry.RegionDescriptor.from_bytes(wire)
        client.write(src_region, dst, chunks=[(0, 0, 5)], tag=7).result(timeout=10)
        for n in client.notifications(timeout=10):          # on the receiving side
            print(n.tag, n.bytes)

Every call raises a ferry.FerryError subclass (PermissionDenied, NotFound, OutOfRange,
Unavailable, ...) carrying the agent's message. Closing the client (or the process
dying) ends the session: the agent releases every region registered in it.
"""
from __future__ import annotations

import array
import dataclasses
import mmap
import os
import sys
import threading
import time
import weakref
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf.message import Message

from . import _native_rpc, errors
from ._proto import ferry_pb2, ferry_pb2_grpc
from ._session import Session
from ._types import Region as Region  # re-exported: ferry.client.Region
from ._types import RegionDescriptor as RegionDescriptor
from .inbox import Inbox
from .notification import Notification, _notification
from .status import AgentStatus
from .write_queue import PATH_NAMES, WriteQueue

Chunk = Tuple[int, int, int]  # (src_offset, dst_offset, length)


class WriteWindow:
    """Byte ranges of some of this client's regions (registered with write_windows=True),
    open to one writer until closed or past its timeout (Client.open_write_window). Hand
    ``descriptors`` to the writer; ``close()`` returns once no byte of any write through
    the window can land any more. A context manager that closes it."""

    def __init__(self, client: "Client", response: ferry_pb2.OpenWriteWindowResponse):
        self._client = client
        self.id: int = response.window_id
        self.descriptors: List[RegionDescriptor] = [RegionDescriptor(d) for d in response.regions]
        self._open = True

    def close(self, wait: float = 1.0) -> None:
        """Closes the window, waiting up to ``wait`` seconds for writes through it that are
        copying on this agent. Raises DeadlineExceeded if some still were (the window is
        closed all the same; close again to wait again)."""
        self._open = False
        self._client._call("CloseWriteWindow", ferry_pb2.CloseWriteWindowRequest(
            window_id=self.id, wait_ms=self._client._wait_ms(wait)), timeout=self._client._call_timeout(wait))

    def __enter__(self) -> "WriteWindow":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open:
            self.close()


class HostRegion(Region):
    """Host memory shared with the agent (a memfd mapped here and there)."""

    def __init__(self, client: "Client", response: ferry_pb2.RegisterMemoryResponse, mapping: mmap.mmap, fd: int,
                 write_windows: bool = False):
        super().__init__(client, response, write_windows)
        self._mmap = mapping
        self._fd = fd  # kept to register the same memory again after an agent restart
        self.buffer = memoryview(mapping)

    def numpy(self) -> Any:
        """The buffer as a numpy uint8 array (no copy)."""
        import numpy as np

        return np.frombuffer(self._mmap, dtype=np.uint8)

    def close(self) -> None:
        """Deregisters and unmaps."""
        self.deregister()
        self.buffer.release()
        self._mmap.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


@dataclasses.dataclass(frozen=True)
class TransferResult:
    transfer_id: int
    bytes: int
    duration_ns: int
    path: str  # "local", "fabric" or "staged"
    tag: int


class NotificationStream:
    """A WatchNotifications stream: iterate it on one thread, cancel() it from any other
    (the iteration then ends)."""

    def __init__(self, call: Any):
        self._call = call  # grpcio's streaming call

    def __iter__(self) -> Iterator[Notification]:
        try:
            for n in self._call:
                yield _notification(n)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return
            raise errors.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()


class TransferFuture:
    """A submitted write. result() waits for it and raises the transfer's error."""

    def __init__(self, client: "Client", answer: ferry_pb2.WriteResponse):
        self._client = client
        self.transfer_id = answer.transfer_id
        # A transfer that finished inside the Write call (a small node-local copy, or any
        # within the call's ``wait``) came back with its result: result() needs no Wait.
        self._result: Optional[ferry_pb2.TransferResult] = answer.result if answer.HasField("result") else None

    def done(self) -> bool:
        return self._poll(0.0)

    def result(self, timeout: Optional[float] = None) -> TransferResult:
        """Waits up to ``timeout`` seconds (None: until done). Raises DeadlineExceeded if
        still running then, or the transfer's own error (e.g. Unavailable)."""
        deadline = None if timeout is None else _now() + timeout
        while not self._poll(60.0 if deadline is None else max(0.0, deadline - _now())):
            if deadline is not None and _now() >= deadline:
                raise errors.DeadlineExceeded(f"transfer {self.transfer_id} is still running after {timeout} s")
        r = self._result
        assert r is not None  # _poll returned True
        if r.code != 0:
            raise errors.from_code(r.code, r.message)
        return TransferResult(r.transfer_id, r.bytes, r.duration_ns, PATH_NAMES.get(r.path, "unknown"), r.tag)

    def _poll(self, seconds: float) -> bool:
        if self._result is None:
            resp = self._client._call("Wait", ferry_pb2.WaitRequest(transfer_id=self.transfer_id,
                                                                    timeout_ms=int(seconds * 1000)),
                                      timeout=seconds + 10)
            if resp.done:
                self._result = resp.result
        return self._result is not None


def _packed_ids(ids: Any) -> Optional[bytes]:
    """``ids`` as PagedChunks' ``*_le32`` bytes (4 bytes an id, little-endian), or None if
    one does not fit 32 bits. Packed ids cost the agent microseconds to read where 32,768
    varints cost ~0.5 ms, and are quicker to make here too."""
    if hasattr(ids, "dtype"):  # numpy: checked and packed without a Python loop
        if ids.dtype.kind not in "iu":
            raise TypeError(f"block ids must be integers, not a numpy array of {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
            return None
        return bytes(ids.astype("<u4").tobytes())
    try:
        packed = array.array("I", ids)  # 4-byte unsigned on the platforms ferry runs on
    except OverflowError:
        return None
    if packed.itemsize != 4:
        return None
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _set_block_ids(paged: ferry_pb2.PagedChunks, src_ids: Iterable[int], dst_ids: Iterable[int]) -> None:
    """Puts a paged layout's ids into ``paged``, packed where they fit 32 bits."""
    for ids, name in ((src_ids, "src_blocks"), (dst_ids, "dst_blocks")):
        if not hasattr(ids, "__len__"):
            ids = list(ids)  # a generator can be read once; below it may be read twice
        packed = _packed_ids(ids)
        if packed is not None:
            setattr(paged, name + "_le32", packed)
        else:
            getattr(paged, name).extend(ids.tolist() if hasattr(ids, "tolist") else ids)


def _now() -> float:
    return time.monotonic()


# Traffic classes by name (ferry.proto's TrafficClass): how a pod's writes share the NICs.
TRAFFIC_CLASSES = {
    "latency": ferry_pb2.TRAFFIC_CLASS_LATENCY,
    "bulk": ferry_pb2.TRAFFIC_CLASS_BULK,
    "background": ferry_pb2.TRAFFIC_CLASS_BACKGROUND,
}


class Client:
    """A session with the local agent; thread-safe.

    ``traffic_class``: the class of this session's writes and queues unless a call names
    another ("latency", "bulk", "background"; None: the agent's rule for this pod decides).
    A class above the pod's ceiling is refused here, at the session's opening, and by any
    call that names one (PermissionDenied).

    ``rpc_lib``: the path of libferry_rpc.so (``bazel build -c opt
    //client/native:libferry_rpc.so``): unary calls then go through the C++ gRPC library,
    at about its cost instead of grpcio's 1.5-3.5x; streams stay on grpcio. None: the path in
    $FERRY_RPC_LIB; "" or unset: grpcio for everything. A path that does not load raises
    FailedPrecondition."""

    def __init__(self, socket: str = "/run/ferry/ferry.sock", timeout: float = 30.0,
                 traffic_class: Optional[str] = None, rpc_lib: Optional[str] = None):
        self.socket = socket
        self.timeout = timeout
        self.traffic_class = traffic_class
        self._traffic_class(traffic_class)  # a wrong name fails here, not at the first write
        self._rpc_lib = _native_rpc.load(rpc_lib)
        self._closed = False
        self._host_regions: "weakref.WeakSet[HostRegion]" = weakref.WeakSet()
        self._open()

    def _open(self) -> None:
        self._session = Session(self.socket)
        self._channel = grpc.insecure_channel(f"unix:{self.socket}", options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        self._stub = ferry_pb2_grpc.AgentStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("ferry-session", self._session.token_hex),)
        self._native = None if self._rpc_lib is None else _native_rpc.NativeChannel(self._rpc_lib, self.socket,
                                                                                    self._metadata)
        if self.traffic_class is not None:
            self._check_ceiling()

    def _check_ceiling(self) -> None:
        """Refuses the session's class if the agent's rule for this pod does not allow it."""
        mine = [t for t in self.status().tenants if t.session_id == self._session.id]
        if mine and mine[0].ceiling and self._traffic_class(None) < TRAFFIC_CLASSES[mine[0].ceiling]:
            ceiling = mine[0].ceiling
            self.close()
            raise errors.PermissionDenied(
                f"traffic class {self.traffic_class} is above this pod's ceiling {ceiling} (agent rule "
                f"{mine[0].rule} of --qos_tenants / --qos_default_tenant): ask for {ceiling} or below, or have the "
                "operator raise the rule's ceiling")

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Ends the session: the agent releases everything registered in it, and has by
        the time this returns (it waits up to 2 s for the agent to say so)."""
        if not self._closed:
            self._closed = True
            self._close_channels()
            self._session.close()

    def connected(self) -> bool:
        """False once the agent ended this session (it exited or restarted; see reconnect).
        Never waits: cheap enough to ask every step."""
        return not self._closed and self._session.alive()

    def reconnect(self, timeout: float = 30.0) -> None:
        """Opens a new session after the agent restarted (calls raise Unavailable until
        then), waiting up to ``timeout`` seconds for the agent to come back, and registers
        every host region of this client again: the same memory, with new ids and
        descriptors, so hand the new descriptors out again. GPU regions are the caller's
        to register again. Writes in flight when the agent died are lost: submit again."""
        deadline = _now() + timeout
        self._close_channels()
        self._session.close()
        while True:
            try:
                self._open()
                break
            except errors.Unavailable:
                if _now() >= deadline:
                    raise
                threading.Event().wait(0.1)
        for region in list(self._host_regions):
            if region._registered:
                resp = self._register_fd(region._fd, region.size, write_windows=region.write_windows)
                region.id, region._descriptor = resp.region_id, resp.region

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ memory

    def register_host(self, size: int, *, write_windows: bool = False) -> HostRegion:
        """Allocates ``size`` bytes of shared host memory and registers them. With
        ``write_windows`` the region takes writes only through windows this client opens
        (open_write_window), never with its own descriptor."""
        if size <= 0:
            raise errors.InvalidArgument(f"size must be at least 1 byte, got {size}")
        fd = os.memfd_create("ferry-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)  # the agent seals it
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
            try:
                resp = self._register_fd(fd, size, write_windows=write_windows)
            except Exception:
                mapping.close()
                raise
        except Exception:
            os.close(fd)
            raise
        region = HostRegion(self, resp, mapping, fd, write_windows)
        self._host_regions.add(region)
        return region

    def _register_fd(self, fd: int, size: int, offset: int = 0, *,
                     write_windows: bool = False) -> ferry_pb2.RegisterMemoryResponse:
        """Registers ``size`` bytes at ``offset`` of the memfd ``fd`` (sent on the session socket)."""
        handle = self._session.send_fd(fd)
        response: ferry_pb2.RegisterMemoryResponse = self._call("RegisterMemory", ferry_pb2.RegisterMemoryRequest(
            size=size, host=ferry_pb2.HostMemory(fd_handle=handle, offset=offset), write_windows=write_windows))
        return response

    def open_write_window(self, regions: Sequence[Region], ranges: Sequence[Tuple[int, int]], *,
                          writer: Union[RegionDescriptor, bytes, None] = None, timeout: float = 30.0) -> WriteWindow:
        """Opens ``ranges`` ((offset, length) byte ranges, the same in each region) of
        ``regions`` (this client's, registered with write_windows=True) to one writer: the
        pod owning the region ``writer`` describes (None: whoever holds the window's
        descriptors), for at most ``timeout`` seconds. Every chunk of a write through it
        must fall inside the ranges; the regions' agent checks, before a byte moves."""
        req = ferry_pb2.OpenWriteWindowRequest(
            region_ids=[r.id for r in regions], ranges=[ferry_pb2.ByteRange(offset=o, length=n) for o, n in ranges],
            timeout_ms=self._timeout_ms(timeout))
        if writer is not None:
            req.writer.CopyFrom(self._descriptor(writer)._proto)
        return WriteWindow(self, self._call("OpenWriteWindow", req))

    def register_cuda(self, tensor: Any, *, write_windows: bool = False) -> Region:
        """Registers a CUDA tensor's memory (PyTorch; contiguous). Tensors made with
        ferry.cuda.empty() go as a POSIX fd (preferred: nothing shared between pods, and
        the agent's GPU kernel can serve them); others as the legacy IPC handle of the
        caching allocator's block. The memory must stay allocated while registered."""
        if not tensor.is_contiguous():
            raise errors.InvalidArgument("register_cuda needs a contiguous tensor")
        return self.register_cuda_ptr(tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                                      tensor.device.index if tensor.device.index is not None else 0,
                                      write_windows=write_windows)

    def register_tensor(self, tensor: Any, *, write_windows: bool = False) -> Region:
        """Registers a contiguous PyTorch tensor's memory: a CUDA tensor as register_cuda
        does; a CPU tensor only if made by ferry.host.empty (an agent maps host memory
        through a file descriptor, which PyTorch's CPU allocator has not). With
        ``write_windows``, as register_host's."""
        if tensor.is_cuda:
            return self.register_cuda(tensor, write_windows=write_windows)
        if not tensor.is_contiguous():
            raise errors.InvalidArgument("register_tensor needs a contiguous tensor")
        from . import host

        ptr, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        buf = host.find_buffer(ptr)
        if buf is None or ptr + size > buf.ptr + buf.size:
            raise errors.InvalidArgument(
                "this CPU tensor's memory cannot be shared with the agent: allocate it with ferry.host.empty()")
        offset = ptr - buf.ptr
        if offset % mmap.PAGESIZE:
            raise errors.InvalidArgument(f"the tensor starts {offset} bytes into its ferry.host buffer; "
                                         f"register a view that starts on a page ({mmap.PAGESIZE} bytes)")
        return Region(self, self._register_fd(buf.fd, size, offset, write_windows=write_windows), write_windows)

    def register_cuda_ptr(self, ptr: int, size: int, device: int, *, write_windows: bool = False) -> Region:
        """Registers ``size`` bytes of device memory at ``ptr`` on CUDA device ``device``."""
        from . import cuda

        buf = cuda.find_buffer(ptr)
        if buf is not None:
            handle = self._session.send_fd(buf.export_fd())
            fd_memory = ferry_pb2.CudaFdMemory(
                fd_handle=handle, fd_kind=ferry_pb2.CudaFdMemory.FD_KIND_POSIX, device=device, offset=ptr - buf.ptr,
                allocation_size=buf.size, pci_bus_id=buf.pci_bus_id)
            req = ferry_pb2.RegisterMemoryRequest(size=size, write_windows=write_windows, cuda_fd=fd_memory)
            return Region(self, self._call("RegisterMemory", req), write_windows)
        ipc, offset, bus_id = cuda.ipc_handle(ptr, device)
        req = ferry_pb2.RegisterMemoryRequest(size=size, write_windows=write_windows, cuda_ipc=ferry_pb2.CudaIpcMemory(
            ipc_handle=ipc, device=device, offset=offset, pci_bus_id=bus_id))
        return Region(self, self._call("RegisterMemory", req), write_windows)

    def _deregister(self, region_id: int) -> None:
        if not self._closed:
            self._call("DeregisterMemory", ferry_pb2.DeregisterMemoryRequest(region_id=region_id))

    # ------------------------------------------------------------------ writes

    def write(self, src: Region, dst: Union[RegionDescriptor, bytes], chunks: Sequence[Chunk], *, tag: int = 0,
              notify: bool = False, notify_payload: bytes = b"", timeout: Optional[float] = None,
              traffic_class: Optional[str] = None, wait: Optional[float] = None) -> TransferFuture:
        """Writes ``chunks`` = [(src_offset, dst_offset, length), ...] of ``src`` into ``dst``.
        With ``notify``, dst's owner gets a Notification with ``tag`` and ``notify_payload``
        (at most 4 KiB) once every byte landed. ``traffic_class``: as the Client's.
        ``wait``: seconds the call may wait for the transfer to finish (at most the agent's
        --max_wait_ms); a write that finished by then returns a done future whose result()
        makes no Wait call: a write and its wait in one round trip."""
        req = self._write_request(src, dst, tag, notify, notify_payload, timeout, traffic_class, wait)
        for s, d, n in chunks:
            req.chunks.chunks.add(src_offset=s, dst_offset=d, length=n)
        return TransferFuture(self, self._call("Write", req, timeout=self._call_timeout(wait)))

    def write_blocks(self, src: Region, dst: Union[RegionDescriptor, bytes], block_size: int,
                     src_ids: Iterable[int], dst_ids: Iterable[int], *, tag: int = 0, notify: bool = False,
                     notify_payload: bytes = b"", timeout: Optional[float] = None,
                     traffic_class: Optional[str] = None, wait: Optional[float] = None) -> TransferFuture:
        """Paged form: block src_ids[i] of ``src`` to block dst_ids[i] of ``dst``, all
        ``block_size`` bytes, in one request (10,000s of blocks are fine; the ids, a
        sequence or a numpy array, travel packed 4 bytes each where they fit 32 bits).
        ``wait``: as write's."""
        req = self._write_request(src, dst, tag, notify, notify_payload, timeout, traffic_class, wait)
        req.paged.block_size = block_size
        _set_block_ids(req.paged, src_ids, dst_ids)
        return TransferFuture(self, self._call("Write", req, timeout=self._call_timeout(wait)))

    def write_batch(self, parts: Sequence[Tuple[Region, Union[RegionDescriptor, bytes], int, int]], block_size: int,
                    src_ids: Iterable[int], dst_ids: Iterable[int], *, tag: int = 0, notify: bool = False,
                    notify_payload: bytes = b"", timeout: Optional[float] = None,
                    traffic_class: Optional[str] = None, wait: Optional[float] = None) -> TransferFuture:
        """One transfer of many parts sharing one block mapping: for each part
        ``(src, dst, src_base, dst_base)``, block src_ids[i] of ``src`` at ``src_base`` to
        block dst_ids[i] of ``dst`` at ``dst_base``, all ``block_size`` bytes (a request's
        KV blocks in every layer's tensor, K and V halves as two parts). One request,
        one result, and with ``notify`` one notification once every part landed.
        ``wait``: as write's."""
        req = ferry_pb2.WriteBatchRequest(tag=tag, notify=notify, notify_payload=bytes(notify_payload),
                                          timeout_ms=self._timeout_ms(timeout),
                                          traffic_class=self._traffic_class(traffic_class),
                                          wait_ms=self._wait_ms(wait))
        req.blocks.block_size = block_size
        _set_block_ids(req.blocks, src_ids, dst_ids)
        for src, dst, src_base, dst_base in parts:
            req.parts.add(src_region_id=src.id, dst=self._descriptor(dst)._proto, src_base=src_base,
                          dst_base=dst_base)
        return TransferFuture(self, self._call("WriteBatch", req, timeout=self._call_timeout(wait)))

    def create_queue(self, destinations: Sequence[Union[RegionDescriptor, bytes]], entries: int = 256,
                     timeout: Optional[float] = None, traffic_class: Optional[str] = None,
                     table_ids: int = 0) -> WriteQueue:
        """A shared-memory write queue to ``destinations`` (1..64; entries name them by
        index): many small writes without an RPC each (ferry.write_queue). ``timeout``:
        deadline of each write in seconds (None: the agent's default); ``traffic_class``:
        of every write (None: the Client's); ``table_ids``: the size of the block table
        for paged writes (``WriteQueue.post_paged``)."""
        return WriteQueue(self, destinations, entries, timeout, traffic_class, table_ids)

    def open_inbox(self, slots: int = 64) -> "Inbox":
        """This session's notifications through shared memory instead of
        notifications(): ``inbox.poll()`` reads them with no RPC and no thread
        (ferry.inbox). One per session; refused while a notifications() stream is open."""
        return Inbox(self, slots)

    def send_message(self, dst: Union[RegionDescriptor, bytes], payload: bytes = b"", *, tag: int = 0,
                     timeout: Optional[float] = None) -> None:
        """Sends ``payload`` (at most 4 KiB) and ``tag`` to the owner of ``dst``'s region,
        on this node or another, without writing into it: the owner's notifications()
        yields it with kind "message". Returns once the region's agent queued it."""
        req = ferry_pb2.SendMessageRequest(dst=self._descriptor(dst)._proto, tag=tag, payload=bytes(payload),
                                           timeout_ms=self._timeout_ms(timeout))
        self._call("SendMessage", req)

    def _write_request(self, src: Region, dst: Union[RegionDescriptor, bytes], tag: int, notify: bool,
                       notify_payload: bytes, timeout: Optional[float], traffic_class: Optional[str],
                       wait: Optional[float]) -> ferry_pb2.WriteRequest:
        return ferry_pb2.WriteRequest(src_region_id=src.id, dst=self._descriptor(dst)._proto, tag=tag, notify=notify,
                                      notify_payload=bytes(notify_payload), timeout_ms=self._timeout_ms(timeout),
                                      traffic_class=self._traffic_class(traffic_class), wait_ms=self._wait_ms(wait))

    @staticmethod
    def _wait_ms(wait: Optional[float]) -> int:
        if wait is None:
            return 0
        if not isinstance(wait, (int, float)) or not 0 <= wait < 4e6:
            raise errors.InvalidArgument(f"wait must be a number of seconds in [0, 4e6), got {wait!r}")
        return int(wait * 1000)

    def _call_timeout(self, wait: Optional[float]) -> float:
        """A write call's deadline: the client's, plus what it may wait for the transfer."""
        return self.timeout + (wait or 0.0)

    def _traffic_class(self, name: Optional[str]) -> ferry_pb2.TrafficClass:
        """The proto value of ``name``, else of the session's class (None: unspecified)."""
        name = self.traffic_class if name is None else name
        if name is None:
            return ferry_pb2.TRAFFIC_CLASS_UNSPECIFIED
        try:
            return TRAFFIC_CLASSES[name]
        except (KeyError, TypeError):
            raise ValueError(f"traffic_class must be one of {sorted(TRAFFIC_CLASSES)} or None, not {name!r}") from None

    @staticmethod
    def _timeout_ms(timeout: Optional[float]) -> int:
        return 0 if timeout is None else max(1, int(timeout * 1000))

    @staticmethod
    def _descriptor(dst: object) -> RegionDescriptor:
        if isinstance(dst, (bytes, bytearray, memoryview)):
            dst = RegionDescriptor.from_bytes(dst)
        if not isinstance(dst, RegionDescriptor):
            raise TypeError("dst must be a RegionDescriptor or its bytes")
        return dst

    # ------------------------------------------------------------------ events

    def notifications(self, timeout: Optional[float] = None) -> Iterator[Notification]:
        """Yields a Notification for each write into this client's regions that asked for
        one, after its bytes landed, and for each message sent to them (send_message).
        Ends after ``timeout`` seconds (None: never)."""
        stream = self.notification_stream(timeout)
        try:
            yield from stream
        finally:
            stream.cancel()

    def notification_stream(self, timeout: Optional[float] = None) -> NotificationStream:
        """notifications() as an object another thread can cancel: for a reader thread
        that must stop without losing what the stream already took from the agent."""
        return NotificationStream(self._stub.WatchNotifications(ferry_pb2.WatchNotificationsRequest(),
                                                                metadata=self._metadata, timeout=timeout))

    def status(self) -> AgentStatus:
        """The agent's state (ferry.status.AgentStatus): its sessions, regions, transfers,
        NICs, peers and each pod's traffic."""
        return AgentStatus.from_proto(self._call("GetStatus", ferry_pb2.GetStatusRequest()))

    # ------------------------------------------------------------------ plumbing

    def _close_channels(self) -> None:
        self._channel.close()
        if self._native is not None:
            self._native.close()

    def _call(self, method: str, request: Message, timeout: Optional[float] = None) -> Any:
        """``method``'s response message (its type is the method's), or raises its FerryError."""
        if self._closed:
            raise errors.Unavailable("this client is closed")
        timeout = self.timeout if timeout is None else timeout
        try:
            if self._native is not None:
                return self._native.call(method, request, timeout)
            return getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout)
        except (grpc.RpcError, errors.FerryError) as e:
            err = e if isinstance(e, errors.FerryError) else errors.from_rpc_error(e)
            if isinstance(err, errors.Cancelled):
                # These calls are never cancelled here: the agent's server cancelled one
                # that raced its shutdown.
                raise errors.Unavailable("the agent cancelled the call as it shut down: call "
                                         "client.reconnect() and register again") from None
            if isinstance(err, (errors.Unauthenticated, errors.Unavailable)) and not self._session.alive():
                raise errors.Unavailable("the agent closed this session (it exited or restarted): call "
                                         "client.reconnect() and register again") from None
            raise err from None
