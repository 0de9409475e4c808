"""The shared-memory transport: Compute's hidden states and grad_input through POSIX
shared memory instead of messages, for a client on the server's host.

The server offers it (GetServerInfo.local_transports has "shm") when it runs with
--local-transports=shm and the caller is on loopback or a Unix socket; the client also
checks that the server's boot id is its own (same host, not another VM). A region is a
shared-memory object named "flce-" + 32 random hex digits, created with mode 0600,
registered on a Regions stream with the 16 random bytes written at its start (which only
its owner can read: a name seen in /dev/shm does not let another tenant register it) and
unlinked as soon as the server has mapped it. The stream renews the lease from its own
thread; closing the client (or losing the stream) releases every region.

Calls that run at the same time use different regions (a small free list); a region grows
when a call needs more than the largest one. When the stream ends (a server restart, a
dropped connection) the server has released its regions: the next call starts a new stream
(a call already under way when it ended fails with NOT_FOUND and lands nothing).
"""
from __future__ import annotations

import ctypes
import errno
import os
import queue
import secrets
import threading
from multiprocessing import shared_memory
from typing import List, Optional

import grpc
import torch

from flce.errors import FlceError


def local_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# How a region that /dev/shm had no room for is refused (FlceError.details starts so).
NO_ROOM = "/dev/shm has no room"

class Region:
    """A registered shared-memory region of `nbytes`; `tensor()` views part of it."""

    def __init__(self, memory: shared_memory.SharedMemory, region_id: str):
        self.memory = memory
        self.region_id = region_id
        self.nbytes = memory.size
        self._pinned_at: Optional[int] = None

    def pin(self) -> None:
        """Page-locks the region for CUDA (once), so that copies between it and a GPU run
        at PCIe speed instead of through a pageable bounce buffer."""
        if self._pinned_at is not None:
            return
        address = ctypes.addressof(ctypes.c_char.from_buffer(self.memory.buf))
        if torch.cuda.cudart().cudaHostRegister(address, self.nbytes, 0) == 0:
            self._pinned_at = address

    def tensor(self, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
        count = 1
        for d in shape:
            count *= d
        return torch.frombuffer(self.memory.buf, dtype=dtype, count=count,
                                offset=offset).view(*shape)

    def close(self) -> None:
        if self._pinned_at is not None:
            torch.cuda.cudart().cudaHostUnregister(self._pinned_at)
            self._pinned_at = None
        try:
            self.memory.close()
        except BufferError:
            pass  # a tensor still views it: the mapping goes with the last view


_NEW_PERIOD = object()  # wakes RegionStream's request generator to renew at a new period


class RegionStream:
    """One Regions stream: registrations answered in order, renewals from a thread."""

    _RENEW_FIRST_S = 5.0

    def __init__(self, method, timeout: Optional[float]):
        self._outbox: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._renew_s = self._RENEW_FIRST_S
        self._closed = False
        self._responses = method(self._requests())
        self._timeout = timeout

    def _requests(self):
        from flce._pb import pb
        while True:
            try:
                item = self._outbox.get(timeout=self._renew_s)
            except queue.Empty:
                yield pb.RegionRequest(renew=True)
                continue
            if item is None:
                return
            if item is _NEW_PERIOD:
                continue  # wait again, with the period the server's lease asks for
            yield item

    def _ask(self, request):
        with self._lock:
            if self._closed:
                raise FlceError("Regions", grpc.StatusCode.FAILED_PRECONDITION,
                                "the shared-memory stream is closed")
            self._outbox.put(request)
            try:
                return next(self._responses)
            except grpc.RpcError as err:
                self._closed = True
                raise FlceError("Regions", err.code(), err.details()) from None
            except StopIteration:
                self._closed = True
                raise FlceError("Regions", grpc.StatusCode.UNAVAILABLE,
                                "the server ended the shared-memory stream") from None

    def broken(self) -> bool:
        """The stream has ended (the server restarted, the connection dropped, a refusal):
        the server has released every region it registered."""
        return self._closed or self._responses.done()

    def ask(self, request):
        """Sends one registration request and returns its answer (raises FlceError)."""
        answer = self._ask(request)
        if answer.lease_s > 0:
            renew_s = max(0.5, answer.lease_s / 3)
            if renew_s != self._renew_s:
                self._renew_s = renew_s
                # the wait under way began with the old period, which may outlast a
                # short lease (--region-lease-s below 15 s)
                self._outbox.put(_NEW_PERIOD)
        return answer

    def register(self, nbytes: int) -> Region:
        from flce._pb import pb
        memory = shared_memory.SharedMemory(name=f"flce-{secrets.token_hex(16)}", create=True,
                                            size=nbytes)
        try:
            # the pages claimed now: writing into a sparse object on a full /dev/shm (a
            # container's is 64 MiB by default) would kill this process with SIGBUS
            os.posix_fallocate(memory._fd, 0, nbytes)
        except OSError as err:
            memory.close()
            memory.unlink()
            code = (grpc.StatusCode.RESOURCE_EXHAUSTED if err.errno == errno.ENOSPC
                    else grpc.StatusCode.FAILED_PRECONDITION)
            raise FlceError("Regions", code, f"{NO_ROOM} for {nbytes} bytes "
                            f"({err.strerror})") from None
        # the proof that this client can write the object (the name is visible in /dev/shm)
        key = secrets.token_bytes(16)
        memory.buf[:16] = key
        try:
            answer = self.ask(pb.RegionRequest(
                register=pb.RegisterRegion(name=memory.name, bytes=nbytes, key=key)))
        except BaseException:
            memory.unlink()
            memory.close()
            raise
        memory.unlink()  # the server has it mapped: nothing may open it by name any more
        return Region(memory, answer.region_id)

    def release(self, region) -> None:
        from flce._pb import pb
        try:
            self._ask(pb.RegionRequest(release=pb.ReleaseRegion(region_id=region.region_id)))
        except FlceError:
            pass  # the stream is gone: the server released it already
        region.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._outbox.put(None)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass


class SharedTransport:
    """Regions for Compute calls: acquire(nbytes) → a free region at least that big.
    `register(stream, nbytes)` makes one (default: a shared-memory object; flce.cuda_ipc
    passes one that allocates GPU memory)."""

    def __init__(self, method, timeout: Optional[float], register=None):
        self._method = method
        self._timeout = timeout
        self._register = register or (lambda stream, nbytes: stream.register(nbytes))
        self._stream: Optional[RegionStream] = None
        self._free: List = []
        self._lock = threading.Lock()

    def acquire(self, nbytes: int):
        with self._lock:
            if self._stream is not None and self._stream.broken():
                # its regions are gone on the server: start over with a new stream
                for region in self._free:
                    region.close()
                self._free = []
                self._stream = None
            if self._stream is None:
                self._stream = RegionStream(self._method, self._timeout)
            fitting = [r for r in self._free if r.nbytes >= nbytes]
            if fitting:
                region = min(fitting, key=lambda r: r.nbytes)
                self._free.remove(region)
                return region
            if self._free:  # too small for this call: make room for a bigger one
                self._stream.release(self._free.pop(0))
            stream = self._stream
        # a quarter more than asked, so that slightly larger calls reuse it
        return self._register(stream, max(nbytes + nbytes // 4, 1 << 20))

    def give_back(self, region) -> None:
        with self._lock:
            self._free.append(region)

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
            free, self._free = self._free, []
        for region in free:
            region.close()
        if stream is not None:
            stream.close()
