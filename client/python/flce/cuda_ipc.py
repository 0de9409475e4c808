"""The CUDA IPC transport: Compute reads hidden states from, and writes grad_input into,
GPU memory of this process, for a trainer whose hidden states are on the GPU the server
computes on (same host).

The server offers it (GetServerInfo.local_transports has "cuda_ipc") when it runs on a GPU
with --local-transports=cuda_ipc and the caller is on loopback or a Unix socket; the client
also checks the boot id (same host) and that hidden is on the server's GPU
(ServerInfo.device_uuid). A region is a cudaMalloc allocation of its own (not the caching
allocator's, so the server sees nothing but the region), with 16 random bytes written at its
start as proof of ownership, and an interprocess CUDA event. A call copies hidden into the
region on the current stream and records the event; the server's GPU waits for the event
before it reads, and the call's summary arrives only once grad_input is written. The
allocation is freed after the server has released it.

The CUDA driver API is reached through ctypes (libcuda.so.1, always present where a GPU is):
PyTorch has no public call for an IPC handle of memory it did not allocate this way.
"""
from __future__ import annotations

import ctypes
import secrets
import threading
from typing import Optional

import grpc
import torch

from flce.errors import FlceError

_HANDLE_BYTES = 64
_ALIGN = 2 << 20


class _Driver:
    """The few driver calls the transport needs, each checked."""

    _lock = threading.Lock()
    _lib = None

    @classmethod
    def lib(cls):
        with cls._lock:
            if cls._lib is None:
                lib = ctypes.CDLL("libcuda.so.1")
                for name, args in (
                        ("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
                        ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(ctypes.c_void_p),
                                                      ctypes.c_int]),
                        ("cuDevicePrimaryCtxRelease_v2", [ctypes.c_int]),
                        ("cuCtxPushCurrent_v2", [ctypes.c_void_p]),
                        ("cuCtxPopCurrent_v2", [ctypes.POINTER(ctypes.c_void_p)]),
                        ("cuMemAlloc_v2", [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                        ("cuMemFree_v2", [ctypes.c_uint64]),
                        ("cuIpcGetMemHandle", [ctypes.c_char_p, ctypes.c_uint64]),
                        ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])):
                    fn = getattr(lib, name)
                    fn.argtypes = args
                    fn.restype = ctypes.c_int
                cls._lib = lib
            return cls._lib

    @classmethod
    def check(cls, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            cls.lib().cuGetErrorName(result, ctypes.byref(name))
            raise FlceError("Regions", grpc.StatusCode.FAILED_PRECONDITION,
                            f"{what} failed: {(name.value or b'?').decode()} ({result})")


class _InContext:
    """The device's primary context (PyTorch's) current on this thread for a driver call."""

    def __init__(self, device: int):
        self.device = device

    def __enter__(self):
        lib = _Driver.lib()
        dev = ctypes.c_int()
        _Driver.check(lib.cuDeviceGet(ctypes.byref(dev), self.device), "cuDeviceGet")
        self.dev = dev.value
        ctx = ctypes.c_void_p()
        _Driver.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev),
                      "cuDevicePrimaryCtxRetain")
        _Driver.check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        return lib

    def __exit__(self, *exc):
        lib = _Driver.lib()
        popped = ctypes.c_void_p()
        lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
        lib.cuDevicePrimaryCtxRelease_v2(self.dev)


class _DeviceArray:
    """__cuda_array_interface__ of raw device bytes, for torch.as_tensor (no copy)."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3,
                                         "strides": None, "stream": None}


def device_uuid(device: torch.device) -> str:
    """The GPU's UUID as 32 hex digits (the server compares it without "GPU-" and dashes)."""
    return str(torch.cuda.get_device_properties(device).uuid).replace("-", "").lower()


def same_gpu(device: torch.device, server_uuid: str) -> bool:
    bare = server_uuid[4:] if server_uuid.startswith("GPU-") else server_uuid
    return bool(bare) and device_uuid(device) == bare.replace("-", "").lower()


class DeviceRegion:
    """A registered GPU region of `nbytes` on `device`; `tensor()` views part of it."""

    def __init__(self, device: torch.device, nbytes: int):
        self.device = torch.device("cuda", device.index if device.index is not None
                                   else torch.cuda.current_device())
        self.nbytes = -(-nbytes // _ALIGN) * _ALIGN
        self.region_id = ""
        torch.cuda.init()
        address = ctypes.c_uint64()
        with _InContext(self.device.index) as lib:
            _Driver.check(lib.cuMemAlloc_v2(ctypes.byref(address), self.nbytes), "cuMemAlloc")
            self.address = address.value
            handle = ctypes.create_string_buffer(_HANDLE_BYTES)
            try:
                _Driver.check(lib.cuIpcGetMemHandle(handle, self.address), "cuIpcGetMemHandle")
            except FlceError:
                lib.cuMemFree_v2(self.address)
                raise
        self.memory_handle = handle.raw
        self._bytes = torch.as_tensor(_DeviceArray(self.address, self.nbytes), device=self.device)
        # written after hidden, waited for by the server's GPU before it reads
        self.ready = torch.cuda.Event(interprocess=True)
        with torch.cuda.device(self.device):
            self.event_handle = bytes(self.ready.ipc_handle())
        self.key = secrets.token_bytes(16)
        self._bytes[:16].copy_(torch.frombuffer(bytearray(self.key), dtype=torch.uint8))
        torch.cuda.synchronize(self.device)

    def tensor(self, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
        count = 1
        for d in shape:
            count *= d
        size = torch.empty((), dtype=dtype).element_size()
        return self._bytes[offset:offset + count * size].view(dtype).view(*shape)

    def mark_written(self) -> None:
        """Records the event on the current stream: hidden is in the region once it fires."""
        self.ready.record(torch.cuda.current_stream(self.device))

    def close(self) -> None:
        if self.address:
            torch.cuda.synchronize(self.device)  # no copy of ours still uses it
            self._bytes = None
            with _InContext(self.device.index) as lib:
                lib.cuMemFree_v2(self.address)
            self.address = 0


def register(stream, nbytes: int, device: torch.device) -> DeviceRegion:
    """Allocates a region on `device` and registers it on the Regions `stream`."""
    from flce._pb import pb
    region = DeviceRegion(device, nbytes)
    try:
        answer = stream.ask(pb.RegionRequest(register=pb.RegisterRegion(
            bytes=region.nbytes, key=region.key,
            cuda_ipc=pb.CudaIpcMemory(memory_handle=region.memory_handle,
                                      event_handle=region.event_handle,
                                      device_uuid=device_uuid(region.device)))))
    except BaseException:
        region.close()
        raise
    region.region_id = answer.region_id
    return region


def transport(method, timeout: Optional[float], device: torch.device):
    """A pool of GPU regions on `device` (see flce.shm.SharedTransport)."""
    from flce.shm import SharedTransport
    return SharedTransport(method, timeout,
                           register=lambda stream, nbytes: register(stream, nbytes, device))
