"""flce.Client: a thin, typed wrapper over the flce.v1.Flce service.

Every method raises flce.FlceError on failure. Tensors go out as zero-copy views of their
storage (flce.tensors) encoded by flce.wire, and come back assembled into one
preallocated tensor.
"""
from __future__ import annotations

import functools
import os
import threading
import uuid
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import grpc
import torch

from flce import cuda_ipc, data_plane, host_memory, pieces, security, shm, tensors, wire
from flce.buffers import BufferPool
from flce._pb import pb, pb_grpc
from flce.commit_queue import CommitQueue
from flce.errors import FlceError, from_rpc_error, translate
from flce.loss_options import LossOptions, keyword_arguments
from flce.policy import PolicyObjective
from flce.preference import PreferenceObjective
from flce.shm import SharedTransport
from flce.results import (CheckpointInfo, CommitResult, ComputeSummary, DownloadHeader,
                          EmbedGradSummary, EmbedHeader, GradHeader, GradNorm, HeadInfo,
                          OptimizerGroup, OptimizerInfo, OptimizerKind, ServerInfo,
                          SessionInfo, StepResult, UnloadResult)

OPTIMIZERS = {"sgd": OptimizerKind.SGD, "adamw": OptimizerKind.ADAMW}
_TOKEN_FIELDS = (("loss", torch.float32), ("logprob", torch.float32),
                 ("entropy", torch.float32), ("correct", torch.uint8))


def new_request_id() -> str:
    return uuid.uuid4().hex


def _serialize(msg) -> bytes:
    # pre-encoded bulk chunks (flce.wire) pass through; everything else is a message
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def _decode_compute_response(raw: bytes):
    number, payload = wire.split_oneof(raw)
    if number == wire.COMPUTE_RESPONSE_GRAD_INPUT:
        return wire.decode_grad_input(payload)
    return pb.ComputeResponse.FromString(raw)


def _decode_fetch_response(raw: bytes):
    number, payload = wire.split_oneof(raw)
    if number == wire.FETCH_RESPONSE_CHUNK:
        return wire.decode_grad_chunk(payload)
    return pb.FetchGradResponse.FromString(raw)


def _decode_download_response(raw: bytes):
    number, payload = wire.split_oneof(raw)
    if number == wire.DOWNLOAD_RESPONSE_CHUNK:
        return wire.decode_grad_chunk(payload)
    return pb.DownloadHeadResponse.FromString(raw)


def _decode_embed_response(raw: bytes):
    number, payload = wire.split_oneof(raw)
    if number == wire.EMBED_RESPONSE_ROWS:
        return wire.decode_embed_rows(payload)
    return pb.EmbedResponse.FromString(raw)


_INT32 = (-(1 << 31), (1 << 31) - 1)


def _token_ids_bytes(method: str, token_ids: torch.Tensor) -> bytes:
    """int32 bytes of integer token ids, any shape, row-major. An id that int32 cannot hold
    is refused here, as the server refuses one outside [0, V): it must not wrap around
    into the vocabulary."""
    if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex \
            or token_ids.dtype == torch.bool:
        raise TypeError(f"token ids must be an integer tensor, got {token_ids.dtype}")
    ids = token_ids.detach().reshape(-1)
    if ids.dtype == torch.int64 and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < _INT32[0] or hi > _INT32[1]:
            bad = lo if lo < _INT32[0] else hi
            index = int((ids == bad).nonzero()[0])
            raise FlceError(method, grpc.StatusCode.INVALID_ARGUMENT,
                            f"token_ids: token id {bad} at index {index} is outside the "
                            "vocabulary (and int32)")
    return tensors.to_bytes_int32(ids)


def _put(method: str, asm: tensors.RowAssembler, first_row: int, data) -> None:
    """A received piece into its place; a piece outside the tensor, of partial rows or of
    rows already received is the server's fault: INTERNAL, as a missing row is."""
    try:
        asm.put(first_row, data)
    except ValueError as err:
        raise FlceError(method, grpc.StatusCode.INTERNAL, str(err)) from None


def optimizer_kind(kind: Union[str, int]) -> OptimizerKind:
    """The kind named "sgd" or "adamw" (any case), or given as an OptimizerKind; anything
    else is a ValueError."""
    if isinstance(kind, str):
        try:
            return OPTIMIZERS[kind.lower()]
        except KeyError:
            raise ValueError(f"unknown optimizer {kind!r}: the server trains heads with "
                             f"{' or '.join(repr(k) for k in OPTIMIZERS)}") from None
    kind = OptimizerKind(kind)
    if kind == OptimizerKind.UNSPECIFIED:
        raise ValueError("optimizer kind is unspecified: choose 'sgd' or 'adamw'")
    return kind


def _group_pb(group: Union[OptimizerGroup, Mapping, None]):
    if group is None:
        return None
    if not isinstance(group, OptimizerGroup):
        group = OptimizerGroup(**dict(group))  # an unknown name: TypeError naming it
    return group.to_pb()


class _RecentTransports:
    """request id -> the transport its first failed call went through; the oldest go first
    beyond `limit` (a retry comes soon after its failure)."""

    def __init__(self, limit: int = 1024):
        self._limit = limit
        self._by_id: "OrderedDict[str, str]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, request_id: str) -> Optional[str]:
        with self._lock:
            return self._by_id.get(request_id)

    def remember(self, request_id: str, transport: str) -> None:
        with self._lock:
            self._by_id.setdefault(request_id, transport)
            while len(self._by_id) > self._limit:
                self._by_id.popitem(last=False)


def _offered_to(kind: str) -> str:
    """Who a server offers regions of `kind` to (flce-server --local-transports), for
    refusals."""
    return (f"by default a client on its Unix socket running as its user; every client on "
            f"its host with --local-transports={kind} (or shm,cuda_ipc)")


@dataclass
class ComputeResult:
    """What one Compute call returned. Per-token tensors are None unless asked for."""
    summary: ComputeSummary
    grad_input: Optional[torch.Tensor] = None  # [N, H], the hidden dtype
    token_outputs: Dict[str, torch.Tensor] = field(default_factory=dict)  # [N] each

    @property
    def loss(self) -> float:
        return self.summary.loss

    @property
    def n_valid(self) -> int:
        return self.summary.n_valid


@dataclass
class GradResult:
    weight: torch.Tensor            # [V, H]
    bias: Optional[torch.Tensor]    # [V] or None
    header: GradHeader
    request_id: str = ""            # as sent: the caller's, or one generated for a reset


class HeadDownload(NamedTuple):
    """A head's weight as DownloadHead sent it: one consistent version (header.head)."""
    weight: torch.Tensor            # [V, H], header.dtype
    bias: Optional[torch.Tensor]    # [V] or None
    header: DownloadHeader


def _after_commits(method):
    """A call that reads or changes a session's gradient (or the head it belongs to) runs
    once this client's background commits have landed (flce.commit_queue)."""
    @functools.wraps(method)
    def inner(self, *args, **kwargs):
        self.drain_commits()
        return method(self, *args, **kwargs)
    return inner


class Client:
    """Connection to one flce server. `session_id` is the default session for gradients."""

    def __init__(self, target: str = "localhost:50051", *, session_id: Optional[str] = None,
                 chunk_bytes: int = tensors.DEFAULT_CHUNK_BYTES,
                 timeout: Optional[float] = None, max_message_bytes: int = -1,
                 channel: Optional[grpc.Channel] = None, tls: bool = False,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, tls_server_name: Optional[str] = None,
                 auth_token: Optional[str] = None, auth_token_file: Optional[str] = None,
                 max_in_flight: int = 1, transport: str = "auto", unix_socket: bool = True,
                 malloc_tuning: bool = True, async_commit: bool = True, connections: int = 1,
                 data_plane: Optional[bool] = None):
        """max_in_flight: how many submitted calls (RemoteLMHead.submit) run at once; 1 lands
        their contributions in submission order. transport: how Compute sends hidden and
        gets grad_input: "auto" (where the server offers it to this client: GPU memory for
        hidden on the server's GPU — flce.cuda_ipc — else shared memory — flce.shm — else
        messages), "grpc" (messages), "shm" (shared memory or an error) or "cuda_ipc"
        (GPU memory for hidden on the server's GPU, else an error).
        tls / tls_ca / tls_cert / tls_key / tls_server_name: TLS (PEM file paths; any of
        them turns TLS on; tls_server_name overrides the name checked in the server's
        certificate). auth_token / auth_token_file / $FLCE_AUTH_TOKEN: the bearer token sent
        with every call. unix_socket: when the server runs on this host and listens on a
        Unix-domain socket (flce-server --unix-socket), the calls that carry tensors in
        messages go through that socket instead of TCP (`messages_target` says where they
        go); only for a channel this client made without TLS. malloc_tuning: before the
        first call that carries tensors in messages, tell glibc's malloc (once per process)
        to keep the message-sized buffers it frees (flce.host_memory: in a process with a
        CUDA context, handing them back to the kernel made such calls ~30 % slower).
        async_commit: loss.backward() (flce.autograd) starts its Commit as a gRPC future
        and returns; this client's calls that read or change a session's gradient
        wait for it first and raise its failure (flce.commit_queue). False: backward
        waits for the Commit. connections: how many connections a Compute call's hidden
        uses when it goes in messages (flce.pieces: the call's own and connections - 1
        ComputePiece streams; servers 0.13+, others get the call's own); at most 9.
        data_plane: a Compute call whose hidden would go in messages sends its rows and gets
        grad_input as raw bytes on a TCP connection of its own instead (flce.data_plane;
        servers 0.18+ unless TLS or --data-port none, 0.16+ with --data-port): None (the
        default) where the server offers it and `target` is a TCP address this client made
        its channel for, falling back to messages with a warning when the port cannot be
        reached; True: always (on the host `target` names), else an error; False: never."""
        self.target = target
        self.session_id = session_id or f"py-{uuid.uuid4().hex[:12]}"
        self.chunk_bytes = chunk_bytes
        self.timeout = timeout
        self.pool = BufferPool()  # grad_input and grad_W memory, recycled once released
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        if transport not in ("auto", "grpc", "shm", "cuda_ipc"):
            raise ValueError(f"transport must be 'auto', 'grpc', 'shm' or 'cuda_ipc', got "
                             f"{transport!r}")
        self.transport = transport
        if not 1 <= connections <= 9:
            raise ValueError(f"connections must be in [1, 9], got {connections}")
        self.connections = connections
        self.data_plane = data_plane
        self._data_plane_off = ""  # why the data plane stopped being tried, once it has
        self._data_plane_reached = False  # its port accepted a connection once
        self._piece_channels: List[grpc.Channel] = []
        self._piece_stubs: List = []
        self._shared: Optional[SharedTransport] = None
        self._device_regions: Optional[SharedTransport] = None  # flce.cuda_ipc
        self._local: Optional[ServerInfo] = None  # the probe's answer, on the same host
        self._local_why = ""  # why local transports are out of reach, when they are
        # MessagesReason of a region kind this client stopped using, once it has
        self._dropped_reason = pb.MESSAGES_REASON_UNSPECIFIED
        # how the last Compute moved hidden: "cuda_ipc", "shm", "data_plane" or "grpc"
        self.last_transport = ""
        # the transport of each recent call that failed, by request id, for its retries
        self._first_transport = _RecentTransports()
        self._executor: Optional[ThreadPoolExecutor] = None  # made by the first submit
        self.async_commit = async_commit
        self._commits = CommitQueue()  # backward's Commits, when async_commit
        self._executor_lock = threading.Lock()
        # the server sizes its messages by --max-message-mb; ours are chunk_bytes at most,
        # so only the receive side needs to follow it (-1 = no client-side limit)
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes)]
        made_channel = channel
        # the data plane's host comes from `target`, which a given channel may not match
        self._target_is_channels = channel is None
        self._creds: Optional[grpc.ChannelCredentials] = None
        tls_used = bool(tls or tls_ca or tls_cert or tls_key or tls_server_name)
        self._tls_used = tls_used
        if channel is None:
            if tls_used:
                if tls_server_name:
                    opts.append(("grpc.ssl_target_name_override", tls_server_name))
                creds = security.channel_credentials(tls_ca, tls_cert, tls_key)
                self._creds = creds
                channel = grpc.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(target, options=opts)
        self._raw_channel = channel
        self._token = security.resolve_token(auth_token, auth_token_file)
        self._channel = self._with_token(channel)
        self._stub = pb_grpc.FlceStub(self._channel)
        # where the tensor-carrying calls go: `target`, or the server's Unix-domain socket
        self.messages_target = target
        self._malloc_tuning = malloc_tuning
        self._unix_options = opts
        self._unix_channel: Optional[grpc.Channel] = None
        self._unix_settled = not unix_socket or made_channel is not None or tls_used \
            or target.startswith("unix:")
        self._bind_bulk(self._channel)
        self._regions = self._channel.stream_stream(
            "/flce.v1.Flce/Regions", request_serializer=_serialize,
            response_deserializer=pb.RegionResponse.FromString)

    def _with_token(self, channel: grpc.Channel) -> grpc.Channel:
        if self._token:
            return grpc.intercept_channel(channel, security.BearerToken(self._token))
        return channel

    def _bind_bulk(self, channel: grpc.Channel) -> None:
        """The calls that carry tensors, and Commit (which follows a Compute), on
        `channel`."""
        # bulk RPCs bypass the generated (de)serializers: see flce.wire
        self._upload = channel.stream_unary(
            "/flce.v1.Flce/UploadHead", request_serializer=_serialize,
            response_deserializer=pb.HeadInfo.FromString)
        self._compute = channel.stream_stream(
            "/flce.v1.Flce/Compute", request_serializer=_serialize,
            response_deserializer=_decode_compute_response)
        self._commit = channel.unary_unary(
            "/flce.v1.Flce/Commit", request_serializer=_serialize,
            response_deserializer=pb.CommitResponse.FromString)
        self._fetch = channel.unary_stream(
            "/flce.v1.Flce/FetchGrad", request_serializer=_serialize,
            response_deserializer=_decode_fetch_response)
        self._download = channel.unary_stream(
            "/flce.v1.Flce/DownloadHead", request_serializer=_serialize,
            response_deserializer=_decode_download_response)
        self._embed = channel.unary_stream(
            "/flce.v1.Flce/Embed", request_serializer=_serialize,
            response_deserializer=_decode_embed_response)
        self._embed_grad = channel.stream_unary(
            "/flce.v1.Flce/EmbedGrad", request_serializer=_serialize,
            response_deserializer=pb.EmbedGradSummary.FromString)

    # ------------------------------------------------------------ lifecycle --
    def wait_ready(self, timeout: float = 10.0) -> "Client":
        ready = grpc.channel_ready_future(self._raw_channel)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ready.cancel()  # else its polling thread outlives a closed channel
            raise FlceError("Connect", grpc.StatusCode.UNAVAILABLE,
                            f"no server at {self.target} after {timeout} s") from None
        return self

    def close(self) -> None:
        """Waits for submitted calls and background commits (raising a commit's failure
        nobody has seen), then closes the channels."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)  # submitted calls finish first
        try:
            self._commits.drain()
        finally:
            self._close_channels()

    def _close_channels(self) -> None:
        for regions in (self._shared, self._device_regions):
            if regions is not None:
                regions.close()
        if self._unix_channel is not None:
            self._unix_channel.close()
        for channel in self._piece_channels:
            channel.close()
        self._raw_channel.close()

    def _probe_local(self) -> Optional[ServerInfo]:
        """The server's info when it is on this host (asked once), else None."""
        if self._local is None:
            try:
                info = self.server_info()
            except FlceError:
                if self.transport in ("shm", "cuda_ipc"):
                    raise
                return None  # the call itself will say what is wrong; ask again next time
            same_host = bool(info.boot_id) and info.boot_id == shm.local_boot_id()
            self._local = info if same_host else replace(
                info, local_transports=(), device_uuid="", unix_socket="")
            self._local_why = ("" if same_host else
                               "it runs on another host (its boot id is not this one's)")
        return self._local

    def _prepare_bulk_call(self) -> None:
        """Before a call that carries tensors in messages: malloc told to keep its buffers
        (flce.host_memory), and the call moved to the server's Unix socket (_settle_unix)."""
        if self._malloc_tuning:
            host_memory.keep_freed_memory()
        self._settle_unix()

    def _settle_unix(self) -> None:
        """Once: the calls that carry tensors, and the region streams, moved to the
        server's Unix-domain socket when the server tells this client one (same host) that
        answers as the same instance. The regions the server offers there (to a caller
        running as its own user) are the ones this client uses."""
        if self._unix_settled:
            return
        with self._executor_lock:
            if self._unix_settled:
                return
            try:
                info = self._probe_local()
            except FlceError:
                info = None
            if info is None:
                return  # not answered: ask again with the next call
            self._unix_settled = True
            path = info.unix_socket
            if not path or not os.path.exists(path):
                return  # none, or in a mount namespace this process does not see
            channel = grpc.insecure_channel("unix:" + path, options=self._unix_options)
            try:
                answer = pb_grpc.FlceStub(self._with_token(channel)).GetServerInfo(
                    pb.ServerInfoRequest(), timeout=5)
                why = ("" if answer.instance_id == info.instance_id else
                       f"another server (instance {answer.instance_id}) answers there")
            except grpc.RpcError as err:
                why = f"{err.code().name}: {err.details()}"
            if why:
                channel.close()
                warnings.warn(f"flce: not using the server's Unix socket {path} ({why}); "
                              f"messages go through {self.target}", RuntimeWarning,
                              stacklevel=3)
                return
            self._unix_channel = channel
            self._bind_bulk(self._with_token(channel))
            self._regions = self._with_token(channel).stream_stream(
                "/flce.v1.Flce/Regions", request_serializer=_serialize,
                response_deserializer=pb.RegionResponse.FromString)
            self._local = replace(self._local, local_transports=tuple(answer.local_transports))
            self.messages_target = "unix:" + path

    def _refuse_transport(self, why: str) -> None:
        raise FlceError("Compute", grpc.StatusCode.FAILED_PRECONDITION,
                        f"transport={self.transport!r} but the server at {self.target}: {why}")

    def shared_transport(self) -> Optional[SharedTransport]:
        """The shared-memory transport when this client uses it (asked once: see
        `transport`), else None."""
        if self.transport in ("grpc", "cuda_ipc"):
            return None
        self._settle_unix()
        with self._executor_lock:
            info = self._probe_local()
            if info is None:
                return None
            if self._shared is None and "shm" in info.local_transports:
                self._shared = SharedTransport(self._regions, self.timeout)
            elif self._shared is None and self.transport == "shm":
                self._refuse_transport(self._local_why or (
                    f"it does not offer shared memory to this client through "
                    f"{self.messages_target} ({_offered_to('shm')})"))
        return self._shared

    def device_transport(self, hidden: torch.Tensor) -> Optional[SharedTransport]:
        """The CUDA IPC transport when it serves `hidden` (on the server's GPU, which the
        server offers it for: see `transport`), else None."""
        if self.transport not in ("auto", "cuda_ipc"):
            return None
        if not hidden.is_cuda:
            if self.transport == "cuda_ipc":
                raise ValueError("transport='cuda_ipc' needs hidden on a GPU; it is on the CPU")
            return None
        self._settle_unix()
        with self._executor_lock:
            info = self._probe_local()
            if info is None:
                return None
            if "cuda_ipc" not in info.local_transports:
                if self.transport == "cuda_ipc":
                    self._refuse_transport(self._local_why or (
                        f"it does not offer CUDA IPC to this client through "
                        f"{self.messages_target} (a server on a GPU; {_offered_to('cuda_ipc')})"))
                return None
            if not cuda_ipc.same_gpu(hidden.device, info.device_uuid):
                if self.transport == "cuda_ipc":
                    self._refuse_transport(
                        f"hidden is on {hidden.device} ({cuda_ipc.device_uuid(hidden.device)}), "
                        f"the server computes on {info.device_uuid}")
                return None
            if self._device_regions is None:
                self._device_regions = cuda_ipc.transport(self._regions, self.timeout,
                                                          hidden.device)
        return self._device_regions

    def executor(self) -> ThreadPoolExecutor:
        """The pool submitted calls run on (gRPC releases the GIL while a call waits)."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_in_flight,
                                                    thread_name_prefix="flce-submit")
            return self._executor

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- heads --
    @translate("GetServerInfo")
    def server_info(self) -> ServerInfo:
        return ServerInfo.from_pb(self._stub.GetServerInfo(pb.ServerInfoRequest(),
                                                           timeout=self.timeout))

    @translate("ListHeads")
    def heads(self) -> List[HeadInfo]:
        return [HeadInfo.from_pb(h) for h in
                self._stub.ListHeads(pb.ListHeadsRequest(), timeout=self.timeout).heads]

    @translate("DescribeHead")
    def describe_head(self, head_id: str) -> HeadInfo:
        return HeadInfo.from_pb(self._stub.DescribeHead(pb.DescribeHeadRequest(head_id=head_id),
                                                        timeout=self.timeout))

    @_after_commits
    @translate("UnloadHead")
    def unload_head(self, head_id: str) -> UnloadResult:
        return UnloadResult.from_pb(self._stub.UnloadHead(pb.UnloadHeadRequest(head_id=head_id),
                                                          timeout=self.timeout))

    @_after_commits
    @translate("LoadHeadFromFile")
    def load_head_from_file(self, head_id: str, path: str, weight_tensor: str,
                            bias_tensor: str = "", dtype: Optional[torch.dtype] = None,
                            reset_optimizer: bool = False) -> HeadInfo:
        """A safetensors file the SERVER reads (path relative to its --head-root).
        reset_optimizer: as in upload_head."""
        req = pb.LoadHeadFromFileRequest(
            head_id=head_id, path=path, weight_tensor=weight_tensor, bias_tensor=bias_tensor,
            dtype=tensors.wire_dtype(dtype) if dtype is not None else pb.DTYPE_UNSPECIFIED,
            reset_optimizer=reset_optimizer)
        return HeadInfo.from_pb(self._stub.LoadHeadFromFile(req, timeout=self.timeout))

    @_after_commits
    @translate("UploadHead")
    def upload_head(self, head_id: str, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None,
                    dtype: Optional[torch.dtype] = None,
                    reset_optimizer: bool = False) -> HeadInfo:
        """Streams W [V, H] (and b [V]) to the server, which keeps them resident in `dtype`
        (default: the weight's). Replacing a head bumps its version. A head with optimizer
        state (create_optimizer) keeps its weight unless reset_optimizer is set, which
        replaces the weight and drops the state (FAILED_PRECONDITION otherwise)."""
        dtype = dtype or weight.dtype
        if weight.dim() != 2:
            raise ValueError(f"weight must be [V, H], got {tuple(weight.shape)}")
        w = tensors.host_contiguous(weight.to(dtype))
        b = tensors.host_contiguous(bias.to(dtype)) if bias is not None else None
        if b is not None and tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"bias must be [{w.shape[0]}], got {tuple(b.shape)}")
        header = pb.UploadHeadRequest(header=pb.UploadHeadHeader(
            head_id=head_id, vocab_size=w.shape[0], hidden_size=w.shape[1],
            dtype=tensors.wire_dtype(dtype), has_bias=b is not None,
            reset_optimizer=reset_optimizer))

        def requests():
            yield header
            for role, t in ((pb.TENSOR_WEIGHT, w), (pb.TENSOR_BIAS, b)):
                if t is None:
                    continue
                for off, piece in tensors.byte_chunks(t, self.chunk_bytes):
                    yield wire.encode_tensor_chunk(role, off, piece)

        self._prepare_bulk_call()
        return HeadInfo.from_pb(self._upload(requests(), timeout=self.timeout))

    # -------------------------------------------------------------- compute --
    @keyword_arguments()
    def compute(self, head_id: str, hidden: torch.Tensor, targets: torch.Tensor, *,
                session_id: Optional[str] = None, request_id: Optional[str] = None,
                reduction: str = "mean", grad_scale: float = 1.0,
                token_weights: Optional[torch.Tensor] = None,
                entropy_weights: Optional[torch.Tensor] = None,
                grad_input: bool = True, forward_only: bool = False,
                per_token_loss: bool = False, logprob: bool = False, entropy: bool = False,
                accuracy: bool = False, deferred_commit: bool = False,
                deterministic: bool = False, expected_head_version: Optional[int] = None,
                pinned_result: Optional[bool] = None,
                policy: Optional[PolicyObjective] = None,
                preference: Optional[PreferenceObjective] = None, **options) -> ComputeResult:
        """One Compute call over hidden [N, H] (fp32/fp16/bf16) and targets [N].

        policy: a flce.PolicyObjective computed in place of the cross-entropy (the reduction
        stays "mean"; its aggregation weighs the tokens). A server without the capability
        "policy_objectives" is refused here, before anything is sent (one that predates
        them would compute the cross-entropy instead). preference: a
        flce.PreferenceObjective likewise (capability "preference_objectives"); not both.

        The loss options (ignore_index, label_smoothing, z_loss, softcap, temperature,
        strategy, chunk_tokens) are keyword arguments named and defaulted by
        flce.loss_options.LossOptions; another name is a TypeError.

        grad_input comes back in hidden's dtype on the CPU (pinned when hidden is on a GPU,
        or when pinned_result says so, ready for a fast copy to a GPU) — through shared
        memory (flce.shm), on hidden's GPU when hidden is on one; with deferred_commit the call's grad_W stays staged
        until commit(request_id)."""
        loss = LossOptions().updated(options)
        if hidden.dim() != 2 or targets.dim() != 1 or targets.shape[0] != hidden.shape[0]:
            raise ValueError(f"need hidden [N, H] and targets [N], got {tuple(hidden.shape)} "
                             f"and {tuple(targets.shape)}")
        n, h = hidden.shape
        hidden_dtype = tensors.wire_dtype(hidden.dtype)
        want_grad_input = grad_input and not forward_only
        outputs = pb.OutputSelection(per_token_loss=per_token_loss, logprob=logprob,
                                     entropy=entropy, accuracy=accuracy,
                                     forward_only=forward_only)
        outputs.grad_input = want_grad_input
        header = pb.ComputeHeader(
            request_id=request_id or new_request_id(), head_id=head_id,
            session_id=session_id if session_id is not None else self.session_id,
            num_tokens=n, hidden_dtype=hidden_dtype, outputs=outputs,
            commit=pb.COMMIT_DEFERRED if deferred_commit else pb.COMMIT_ON_COMPLETE,
            deterministic=deterministic)
        loss.fill(header, reduction, grad_scale)
        if expected_head_version is not None:
            header.expected_head_version = expected_head_version
        for name, w in (("token_weights", token_weights), ("entropy_weights", entropy_weights)):
            if w is not None:
                if w.numel() != n:
                    raise ValueError(f"{name} must have {n} elements, got {w.numel()}")
                setattr(header, name, tensors.to_bytes_fp32(w.reshape(-1)))
        if policy is not None:
            self._require_capability("policy_objectives", "a policy objective")
            policy.fill(header, n)
        if preference is not None:
            if policy is not None:
                raise ValueError("a call carries a policy or a preference objective, not both")
            self._require_capability("preference_objectives", "a preference objective")
            preference.fill(header, n)

        pinned = hidden.is_cuda if pinned_result is None else pinned_result
        wanted = [(k, dt) for k, dt in _TOKEN_FIELDS
                  if {"loss": per_token_loss, "logprob": logprob, "entropy": entropy,
                      "correct": accuracy}[k]]
        # a retry takes the way its request id first went: a GPU server fingerprints a call
        # whose hidden came from a region apart from one whose hidden came in messages
        first = self._first_transport.get(header.request_id)
        local = (("cuda_ipc", self.device_transport(hidden)),
                 ("shm", self.shared_transport())) if n > 0 else ()
        for name, pool in local:
            if pool is not None and first in (None, name):
                try:
                    result = self._compute_shared(pool, header, hidden, targets,
                                                  want_grad_input, wanted, pinned)
                except FlceError:
                    self._first_transport.remember(header.request_id, name)
                    raise
                if result is not None:
                    self.last_transport = name
                    return result
        if first not in (None, "grpc"):
            raise FlceError("Compute", grpc.StatusCode.FAILED_PRECONDITION,
                            f"request_id {header.request_id} was first sent through {first}, "
                            f"which this client cannot use for it now: a retry goes the way "
                            f"its request id first went (the server tells the two apart)")
        self.last_transport = "grpc"
        self._prepare_bulk_call()
        header.messages_reason = self._why_messages(n)
        row_bytes = h * hidden.element_size()
        link = self._open_data_plane(n)
        if link is not None:
            return self._compute_on_data_plane(link, header, hidden, targets, row_bytes,
                                               want_grad_input, wanted, pinned)
        hid = tensors.host_contiguous(hidden)
        rows_per_chunk = max(1, self.chunk_bytes // row_bytes) if row_bytes else max(n, 1)
        streams = self._hidden_streams(-(-n // rows_per_chunk))
        # with pieces, chunk_bytes / streams each: a chunk's worth in flight on all the
        # streams together, so that the first rows arrive as early as on one stream
        chunks = list(tensors.row_chunks(hid, max(row_bytes, self.chunk_bytes // streams)))
        header.hidden_pieces = streams - 1
        shares = pieces.deal(chunks, streams)
        senders = pieces.PieceSenders(self._piece_stubs[:streams - 1], shares[1:], row_bytes,
                                      self.timeout) if streams > 1 else None

        # hidden_size (field 18) is appended by hand: always sent, so that the server
        # checks it against the head's H whatever protobuf classes this install has
        header.targets = tensors.to_bytes_int32(targets)
        header_bytes = wire.encode_compute_header(header.SerializeToString(), h)

        def requests():
            yield header_bytes
            for row, piece in shares[0]:
                yield wire.encode_hidden_chunk(row, piece)
            # Only this says "done": the server lands nothing from a stream that just stops
            # (with pieces, it takes this message once every piece has ended).
            yield wire.encode_end_of_input(n)

        try:
            return self._run_compute(requests(), n, h, hidden.dtype, want_grad_input, wanted,
                                     pinned, on_pieces=senders.start if senders else None,
                                     on_call=senders.bind if senders else None)
        except FlceError as err:
            self._first_transport.remember(header.request_id, "grpc")
            if (senders is not None and senders.failure is not None
                    and err.code == grpc.StatusCode.CANCELLED):
                # this client cancelled the call: a piece failed first
                failure = from_rpc_error("ComputePiece", senders.failure)
                raise FlceError("Compute", failure.code,
                                f"hidden on another connection (ComputePiece) failed: "
                                f"{failure.details}", request_id=header.request_id) from err
            err.request_id = header.request_id  # a retry with it is never applied twice
            raise
        finally:
            if senders is not None:
                senders.unbind()
                senders.join()  # each is answered once the call has its rows, or has ended

    def _open_data_plane(self, n: int) -> Optional[data_plane.DataPlaneCall]:
        """A connection to the server's data plane for a call of `n` rows, where this
        client uses it (see `data_plane`), else None."""
        if self.data_plane is False or n == 0 or self._data_plane_off:
            return None
        info = self._probe_local()
        host = data_plane.tcp_host(self.target)
        why = ("this client was given a channel: `target` may name another server"
               if self.data_plane is None and not self._target_is_channels else
               "the server does not answer GetServerInfo" if info is None else
               f"the server ({info.version}) has no data plane (flce-server --data-port)"
               if "data_plane" not in info.capabilities or not info.data_plane_port else
               "this client uses TLS, which the data plane does not carry"
               if self._tls_used else
               f"the target {self.target} is not a TCP address" if host is None else "")
        if why:
            if self.data_plane:
                raise FlceError("Compute", grpc.StatusCode.FAILED_PRECONDITION,
                                f"data_plane=True but {why}")
            return None
        try:
            if not self._data_plane_reached:
                data_plane.probe(host, info.data_plane_port)
                self._data_plane_reached = True
            return data_plane.DataPlaneCall(host, info.data_plane_port)
        except OSError as err:
            why = f"cannot connect to {host}:{info.data_plane_port}: {err}"
            if self.data_plane:
                raise FlceError("Compute", grpc.StatusCode.UNAVAILABLE,
                                f"data plane: {why}") from err
            self._data_plane_off = why
            warnings.warn(f"flce: not using the server's data plane ({why}); Compute calls "
                          f"send hidden in messages", RuntimeWarning, stacklevel=4)
            return None

    def _compute_on_data_plane(self, link: data_plane.DataPlaneCall, header,
                               hidden: torch.Tensor, targets: torch.Tensor, row_bytes: int,
                               want_grad_input: bool, wanted, pinned: bool) -> ComputeResult:
        """Compute with hidden's rows and grad_input on `link`; the call's own stream
        carries the header and the end message only. Hidden on a GPU comes to the host a
        chunk at a time, on the sending thread, as the chunks go out."""
        n, h = hidden.shape
        header.data_plane = True
        header.targets = tensors.to_bytes_int32(targets)
        header_bytes = wire.encode_compute_header(header.SerializeToString(), h)
        chunks = tensors.host_row_chunks(hidden, max(row_bytes, self.chunk_bytes))
        self.last_transport = "data_plane"
        try:
            return self._run_compute(iter((header_bytes, wire.encode_end_of_input(n))), n, h,
                                     hidden.dtype, want_grad_input, wanted, pinned,
                                     data_plane_call=(link, chunks))
        except FlceError as err:
            self._first_transport.remember(header.request_id, "grpc")
            err.request_id = header.request_id  # a retry with it is never applied twice
            if link.send_failure is not None and not isinstance(link.send_failure, OSError):
                raise FlceError("Compute", grpc.StatusCode.INTERNAL,
                                f"data plane: reading hidden failed: {link.send_failure!r}",
                                request_id=header.request_id) from link.send_failure
            raise
        finally:
            link.close()

    def _require_capability(self, capability: str, what: str) -> None:
        """FAILED_PRECONDITION, before any call, where the server does not name
        `capability` in GetServerInfo."""
        info = self._probe_local() or self.server_info()
        if capability not in info.capabilities:
            raise FlceError("Compute", grpc.StatusCode.FAILED_PRECONDITION,
                            f"the server ({info.version}, engine {info.engine}) does not "
                            f"compute {what}: its capabilities do not name {capability!r}")

    def _hidden_streams(self, chunks: int) -> int:
        """How many streams (the call's own and its pieces) carry a call's `chunks` row
        chunks in messages: `connections`, where the server takes pieces, each stream at
        least one chunk."""
        if self.connections <= 1 or chunks <= 1:
            return 1
        info = self._probe_local()
        if info is None or "hidden_pieces" not in info.capabilities:
            return 1
        streams = min(self.connections, chunks)
        with self._executor_lock:
            while len(self._piece_stubs) < streams - 1:
                # a connection of its own each: gRPC shares one subchannel between channels
                # of equal arguments unless told not to
                opts = self._unix_options + [("grpc.use_local_subchannel_pool", 1)]
                target = self.messages_target
                channel = (grpc.secure_channel(target, self._creds, options=opts)
                           if self._creds is not None and not target.startswith("unix:")
                           else grpc.insecure_channel(target, options=opts))
                self._piece_channels.append(channel)
                self._piece_stubs.append(self._with_token(channel).stream_unary(
                    "/flce.v1.Flce/ComputePiece", request_serializer=_serialize,
                    response_deserializer=pb.ComputePieceResponse.FromString))
        return streams

    def _why_messages(self, n: int) -> int:
        """The MessagesReason a call that sends hidden in messages tells the server (for
        its metrics), as far as this client knows it."""
        if self.transport == "grpc":
            return pb.MESSAGES_REASON_ASKED
        info = self._local
        if n == 0 or info is None:
            return pb.MESSAGES_REASON_UNSPECIFIED
        if self._local_why:
            return pb.MESSAGES_REASON_NOT_LOCAL
        if self._dropped_reason != pb.MESSAGES_REASON_UNSPECIFIED:
            return self._dropped_reason
        if not info.local_transports:
            return pb.MESSAGES_REASON_NOT_OFFERED
        return pb.MESSAGES_REASON_UNSUITABLE

    def _compute_shared(self, shared: SharedTransport, header, hidden: torch.Tensor,
                        targets: torch.Tensor, want_grad_input: bool, wanted,
                        pinned: bool) -> Optional[ComputeResult]:
        """Compute with hidden (and, where the server takes them there, the targets)
        written into a shared-memory region (from the GPU or the CPU directly) and
        grad_input read from it: the messages are the header and end. None when no region
        could be registered (transport "auto": messages from now on)."""
        n, h = hidden.shape
        nbytes = n * h * hidden.element_size()
        on_device = shared is self._device_regions
        # hidden, grad_input, then the targets as int32 (aligned for the int32 view)
        targets_offset = -(-(2 * nbytes if want_grad_input else nbytes) // 16) * 16
        # only a copy within one device: from the GPU into GPU memory (CUDA IPC), or from
        # host memory into shared memory (targets on a GPU go through the header for shm:
        # measured slower into a region than in the header)
        in_region = ("targets_in_region" in (self._local.capabilities if self._local else ())
                     and targets.is_cuda == on_device)
        try:
            region = shared.acquire(targets_offset + (4 * n if in_region else 0))
        except FlceError as err:
            if self.transport in ("shm", "cuda_ipc"):
                raise
            # e.g. a server running as another user cannot open this user's 0600 objects,
            # or /dev/shm is full: this kind is not tried again by this client
            what = "CUDA IPC" if on_device else "shared memory"
            warnings.warn(f"flce: {what} with {self.target} failed ({err.code.name}: "
                          f"{err.details}); using {'shared memory or ' if on_device else ''}"
                          f"messages from now on", RuntimeWarning, stacklevel=3)
            kind = "cuda_ipc" if on_device else "shm"
            with self._executor_lock:
                self._dropped_reason = (pb.MESSAGES_REASON_NO_ROOM
                                        if err.details.startswith(shm.NO_ROOM)
                                        else pb.MESSAGES_REASON_REFUSED)
                if on_device:
                    self._device_regions = None
                else:
                    self._shared = None
                if self._local is not None:
                    self._local = replace(self._local, local_transports=tuple(
                        t for t in self._local.local_transports if t != kind))
            shared.close()
            return None
        try:
            if not on_device and (hidden.is_cuda or pinned):
                region.pin()
            region.tensor(0, (n, h), hidden.dtype).copy_(hidden.detach())
            if in_region:  # no device-to-host copy, no 4 bytes per token in the header
                region.tensor(targets_offset, (n,), torch.int32).copy_(targets.reshape(-1))
            else:
                header.targets = tensors.to_bytes_int32(targets)
            if on_device:
                region.mark_written()
            header.shared.CopyFrom(pb.SharedHidden(region_id=region.region_id, hidden_offset=0,
                                                   grad_input_offset=nbytes))
            if in_region:
                header.shared.targets_offset = targets_offset
            messages = [wire.encode_compute_header(header.SerializeToString(), h),
                        wire.encode_end_of_input(n)]
            try:
                result = self._run_compute(iter(messages), n, h, hidden.dtype, False, wanted,
                                           pinned)
            except FlceError as err:
                err.request_id = header.request_id
                raise
            if want_grad_input:
                if hidden.is_cuda:  # from the page-locked (or GPU) region to the GPU
                    grad = torch.empty((n, h), dtype=hidden.dtype, device=hidden.device)
                else:
                    grad = (tensors.PinnedPool if pinned else self.pool).empty((n, h),
                                                                               hidden.dtype)
                grad.copy_(region.tensor(nbytes, (n, h), hidden.dtype))
                result.grad_input = grad
            return result
        finally:
            shared.give_back(region)

    @translate("Compute")
    def _run_compute(self, requests: Iterable, n: int, h: int, dtype: torch.dtype,
                     want_grad_input: bool, wanted: Sequence[Tuple[str, torch.dtype]],
                     on_gpu: bool, on_pieces=None, on_call=None,
                     data_plane_call=None) -> ComputeResult:
        pool = tensors.PinnedPool if on_gpu else self.pool
        grad = tensors.RowAssembler(n, h, dtype, pool) if want_grad_input else None
        link = None
        if data_plane_call is not None:
            link, chunks = data_plane_call
            on_pieces = lambda token: link.start(token, chunks, n, grad)  # noqa: E731
        per_token = {k: tensors.RowAssembler(n, 1, dt) for k, dt in wanted}
        summary = None
        call = self._compute(requests, timeout=self.timeout)
        if on_call is not None:
            on_call(call)
        for msg in call:
            if isinstance(msg, wire.GradInputView):
                if grad is None or link is not None:
                    raise FlceError("Compute", grpc.StatusCode.INTERNAL,
                                    "server sent grad_input in messages that was not asked "
                                    "for there")
                _put("Compute", grad, msg.token_offset, msg.data)
                continue
            kind = msg.WhichOneof("msg")
            if kind == "token_outputs":
                chunk = msg.token_outputs
                for k, asm in per_token.items():
                    _put("Compute", asm, chunk.token_offset, getattr(chunk, k))
            elif kind == "summary":
                summary = msg.summary
            elif kind == "pieces":
                if on_pieces is None:
                    raise FlceError("Compute", grpc.StatusCode.INTERNAL,
                                    "server opened pieces that were not asked for")
                try:
                    on_pieces(msg.pieces.token)
                except OSError as err:  # the data plane's connection
                    call.cancel()
                    raise FlceError("Compute", grpc.StatusCode.UNAVAILABLE,
                                    f"data plane: cannot connect to "
                                    f"{link.address[0]}:{link.address[1]}: {err}") from err
        if summary is None:
            raise FlceError("Compute", grpc.StatusCode.INTERNAL, "stream ended without summary")
        if link is not None:
            link.finish()
            if link.receive_failure is not None:
                raise FlceError("Compute", grpc.StatusCode.INTERNAL,
                                f"data plane: grad_input: {link.receive_failure}")
        for name, asm in ([("grad_input", grad)] if grad else []) + list(per_token.items()):
            if not asm.complete:
                raise FlceError("Compute", grpc.StatusCode.INTERNAL,
                                f"{name}: {asm.rows_filled} of {n} rows received")
        return ComputeResult(summary=ComputeSummary.from_pb(summary),
                             grad_input=grad.tensor if grad else None,
                             token_outputs={k: a.tensor.reshape(-1) for k, a in per_token.items()})

    # ------------------------------------------------------------ gradients --
    @translate("Commit")
    def commit(self, head_id: str, request_id: str, scale: float = 1.0, *,
               session_id: Optional[str] = None, discard: bool = False,
               timeout: Optional[float] = None) -> CommitResult:
        """Lands (grad_W += scale × staged) or discards a deferred call's contribution.
        scale is always sent explicitly, 0.0 included (unset would mean 1.0)."""
        return CommitResult.from_pb(
            self._commit(self._commit_request(head_id, request_id, scale, session_id, discard),
                         timeout=timeout if timeout is not None else self.timeout))

    def _commit_request(self, head_id: str, request_id: str, scale: float,
                        session_id: Optional[str], discard: bool = False) -> bytes:
        req = pb.CommitRequest(head_id=head_id, request_id=request_id, discard=discard,
                               session_id=session_id if session_id is not None
                               else self.session_id)
        return wire.encode_commit(req.SerializeToString(), scale)

    def commit_in_background(self, head_id: str, request_id: str, scale: float, *,
                             session_id: Optional[str] = None) -> None:
        """commit() started as a gRPC future (after the previous one has finished), or made
        at once without async_commit; a failure is raised by the next drain_commits()."""
        if not self.async_commit:
            self.commit(head_id, request_id, scale, session_id=session_id)
            return
        payload = self._commit_request(head_id, request_id, scale, session_id)
        self._commits.submit(lambda: self._commit.future(payload, timeout=self.timeout))

    @property
    def pending_commits(self) -> int:
        """Background commits not finished yet."""
        return len(self._commits)

    def drain_commits(self, timeout: Optional[float] = None) -> None:
        """Waits until every background commit has landed; raises the first failure
        (once)."""
        self._commits.drain(timeout)

    @_after_commits
    def fetch_grad(self, head_id: str, *, session_id: Optional[str] = None,
                   dtype: torch.dtype = torch.float32, reset: bool = False,
                   request_id: Optional[str] = None, chunk_rows: int = 0) -> GradResult:
        """The session's accumulated grad_W (and grad_b) as CPU tensors of `dtype`.

        With reset=True the fetch is retry-safe: a request id is generated when none is
        given (GradResult.request_id, and FlceError.request_id when the call fails), and
        fetching again with that id returns the same gradient (header.replayed) instead of
        the empty accumulator the first fetch left behind."""
        if reset and not request_id:
            request_id = new_request_id()
        request_id = request_id or ""
        try:
            return self._fetch_grad(head_id, session_id, dtype, reset, request_id, chunk_rows)
        except FlceError as err:
            err.request_id = request_id or None
            raise

    @translate("FetchGrad")
    def _fetch_grad(self, head_id: str, session_id: Optional[str], dtype: torch.dtype,
                    reset: bool, request_id: str, chunk_rows: int) -> GradResult:
        req = pb.FetchGradRequest(head_id=head_id, dtype=tensors.wire_dtype(dtype),
                                  reset=reset, request_id=request_id, chunk_rows=chunk_rows,
                                  session_id=session_id if session_id is not None
                                  else self.session_id)
        header = weight = bias = None
        self._prepare_bulk_call()
        for msg in self._fetch(req, timeout=self.timeout):
            if isinstance(msg, wire.GradChunkView):
                if header is None:
                    raise FlceError("FetchGrad", grpc.StatusCode.INTERNAL, "chunk before header")
                target = weight if msg.role == pb.TENSOR_WEIGHT else bias
                if target is None:
                    raise FlceError("FetchGrad", grpc.StatusCode.INTERNAL,
                                    f"unexpected chunk role {msg.role}")
                _put("FetchGrad", target, msg.row_offset, msg.data)
            elif msg.WhichOneof("msg") == "header":
                header = msg.header
                dt = tensors.torch_dtype(header.dtype)
                weight = tensors.RowAssembler(header.vocab_size, header.hidden_size, dt,
                                              self.pool)
                bias = tensors.RowAssembler(header.vocab_size, 1, dt) if header.has_bias else None
        if header is None or not weight.complete or (bias is not None and not bias.complete):
            raise FlceError("FetchGrad", grpc.StatusCode.INTERNAL, "incomplete gradient stream")
        return GradResult(weight.tensor, bias.tensor.reshape(-1) if bias else None,
                          GradHeader.from_pb(header), request_id)

    @_after_commits
    @translate("ZeroGrad")
    def zero_grad(self, head_id: str, *, session_id: Optional[str] = None) -> None:
        self._stub.ZeroGrad(pb.ZeroGradRequest(
            head_id=head_id,
            session_id=session_id if session_id is not None else self.session_id),
            timeout=self.timeout)

    @_after_commits
    @translate("ListSessions")
    def sessions(self, head_id: str = "") -> List[SessionInfo]:
        return [SessionInfo.from_pb(s) for s in
                self._stub.ListSessions(pb.ListSessionsRequest(head_id=head_id),
                                        timeout=self.timeout).sessions]

    @_after_commits
    @translate("DeleteSession")
    def delete_session(self, head_id: str, session_id: Optional[str] = None) -> None:
        self._stub.DeleteSession(pb.DeleteSessionRequest(
            head_id=head_id,
            session_id=session_id if session_id is not None else self.session_id),
            timeout=self.timeout)

    # ------------------------------------------------------------- training --
    @translate("CreateOptimizer")
    def create_optimizer(self, head_id: str, kind: Union[str, int], *,
                         weight: Union[OptimizerGroup, Mapping, None] = None,
                         bias: Union[OptimizerGroup, Mapping, None] = None,
                         replace: bool = False) -> OptimizerInfo:
        """Creates the head's optimizer state on the server: kind "sgd" or "adamw"
        (torch.optim.SGD / AdamW semantics), hyper-parameters per group as a
        flce.OptimizerGroup or a dict of its fields (unset ones get torch's defaults; the
        bias group defaults to the weight's). With replace, existing state (moments, step
        count) is dropped; without it a head that has state gives ALREADY_EXISTS. The
        learning rate is not here: every step() sends it."""
        req = pb.CreateOptimizerRequest(head_id=head_id, kind=int(optimizer_kind(kind)),
                                        replace=replace)
        for name, group in (("weight", weight), ("bias", bias)):
            msg = _group_pb(group)
            if msg is not None:
                getattr(req, name).CopyFrom(msg)
        return OptimizerInfo.from_pb(self._stub.CreateOptimizer(req, timeout=self.timeout))

    @_after_commits
    def step(self, head_id: str, lr: float, *, session_id: Optional[str] = None,
             bias_lr: Optional[float] = None, clip_coef: Optional[float] = None,
             grad_multiplier: Optional[float] = None, found_inf: bool = False,
             request_id: Optional[str] = None,
             expected_head_version: Optional[int] = None) -> StepResult:
        """Applies the session's gradient × clip_coef × grad_multiplier to the head with its
        optimizer (lr for the weight, bias_lr, default lr, for the bias), or skips it when
        found_inf; either way the session's gradient is then zero. Applied steps bump the
        head's version. A session that holds no contribution (none since the last step or
        zero_grad, or a session the server does not have) is skipped,
        StepOutcome.SKIPPED_NO_GRADIENT, changing nothing, as torch.optim skips a
        parameter whose grad is None.

        Retry-safe: the request id (generated when not given) comes back in
        FlceError.request_id when the call fails; a Step repeated with it and the same
        values returns the first outcome (replayed) and applies nothing again."""
        request_id = request_id or new_request_id()
        req = pb.StepRequest(head_id=head_id, request_id=request_id, lr=lr,
                             found_inf=found_inf,
                             session_id=session_id if session_id is not None
                             else self.session_id)
        for name, value in (("bias_lr", bias_lr), ("clip_coef", clip_coef),
                            ("grad_multiplier", grad_multiplier),
                            ("expected_head_version", expected_head_version)):
            if value is not None:
                setattr(req, name, value)
        try:
            return self._step(req)
        except FlceError as err:
            err.request_id = request_id
            raise

    @translate("Step")
    def _step(self, req) -> StepResult:
        return StepResult.from_pb(self._stub.Step(req, timeout=self.timeout))

    @_after_commits
    @translate("GradNorm")
    def grad_norm(self, head_id: str, session_id: Optional[str] = None) -> GradNorm:
        """Squared L2 norms (fp64) of the session's gradient, for clipping by a global norm
        (flce.clip_grad_norm_). A session the server does not have gives zeros."""
        return GradNorm.from_pb(self._stub.GradNorm(pb.GradNormRequest(
            head_id=head_id,
            session_id=session_id if session_id is not None else self.session_id),
            timeout=self.timeout))

    def download_head(self, head_id: str, master: bool = False, *, chunk_rows: int = 0,
                      retries: int = 3) -> HeadDownload:
        """The head's weight (and bias) as compute calls use them, in the head's dtype, or
        with master=True the fp32 master a 16-bit head is trained in (the weight widened
        when it has no optimizer state). One consistent version, header.head.version: a
        Step during the download aborts it and it is tried again, `retries` times."""
        for attempt in range(retries + 1):
            try:
                return self._download_head(head_id, master, chunk_rows)
            except FlceError as err:
                if err.code != grpc.StatusCode.ABORTED or attempt == retries:
                    raise
        raise AssertionError("unreachable")

    @translate("DownloadHead")
    def _download_head(self, head_id: str, master: bool, chunk_rows: int) -> HeadDownload:
        req = pb.DownloadHeadRequest(head_id=head_id, master=master, chunk_rows=chunk_rows)
        self._prepare_bulk_call()

        def bad(what: str) -> FlceError:
            return FlceError("DownloadHead", grpc.StatusCode.INTERNAL, what)

        header = weight = bias = None
        for msg in self._download(req, timeout=self.timeout):
            if isinstance(msg, wire.GradChunkView):
                if header is None:
                    raise bad("chunk before header")
                target = {pb.TENSOR_WEIGHT: weight, pb.TENSOR_BIAS: bias}.get(msg.role)
                if target is None:
                    raise bad(f"unexpected chunk role {msg.role}")
                row_bytes = target.tensor.shape[1] * target.tensor.element_size()
                if msg.rows * row_bytes != len(msg.data):
                    raise bad(f"chunk at row {msg.row_offset} says {msg.rows} rows but "
                              f"carries {len(msg.data)} bytes")
                _put("DownloadHead", target, msg.row_offset, msg.data)
            elif msg.WhichOneof("msg") == "header":
                if header is not None:
                    raise bad("second header")
                header = DownloadHeader.from_pb(msg.header)
                v, h = header.head.vocab_size, header.head.hidden_size
                dt = tensors.torch_dtype(header.dtype)
                weight = tensors.RowAssembler(v, h, dt)
                bias = tensors.RowAssembler(v, 1, dt) if header.head.has_bias else None
        if header is None:
            raise bad("stream ended without a header")
        for name, asm in (("weight", weight), ("bias", bias)):
            if asm is not None and not asm.complete:
                raise bad(f"{name}: {asm.rows_filled} of {asm.tensor.shape[0]} rows received")
        return HeadDownload(weight.tensor, bias.tensor.reshape(-1) if bias else None, header)

    # ------------------------------------------------------- tied embeddings --
    def embed(self, head_id: str, token_ids: torch.Tensor, *,
              dtype: Optional[torch.dtype] = None,
              expected_head_version: Optional[int] = None, chunk_rows: int = 0,
              retries: int = 3) -> torch.Tensor:
        """The head's weight rows of token_ids (an integer tensor of any shape, each id in
        [0, V)): a tensor [*token_ids.shape, H] on the CPU (pinned when token_ids is on a
        GPU, ready for a fast copy), in the head's dtype (dtype=None) or torch.float32. Every
        row is of one head version: a Step during the call aborts it (ABORTED) and it is
        tried again, `retries` times; with expected_head_version a head at another version
        is FAILED_PRECONDITION. At most the server's --max-request-tokens ids per call."""
        return self._embed_call(head_id, token_ids, dtype=dtype,
                                expected_head_version=expected_head_version,
                                chunk_rows=chunk_rows, retries=retries)[0]

    def _embed_call(self, head_id: str, token_ids: torch.Tensor, *,
                    dtype: Optional[torch.dtype] = None,
                    expected_head_version: Optional[int] = None, chunk_rows: int = 0,
                    retries: int = 3) -> Tuple[torch.Tensor, EmbedHeader]:
        """embed(), with the stream's header (the head version of the rows)."""
        self._prepare_bulk_call()
        req = pb.EmbedRequest(head_id=head_id, token_ids=_token_ids_bytes("Embed", token_ids),
                              dtype=tensors.wire_dtype(dtype) if dtype is not None
                              else pb.DTYPE_UNSPECIFIED, chunk_rows=chunk_rows)
        if expected_head_version is not None:
            req.expected_head_version = expected_head_version
        pool = tensors.PinnedPool if token_ids.is_cuda else None
        for attempt in range(retries + 1):
            try:
                rows, header = self._run_embed(req, token_ids.numel(), pool)
                break
            except FlceError as err:
                if err.code != grpc.StatusCode.ABORTED or attempt == retries:
                    raise
        return rows.reshape(*token_ids.shape, header.hidden_size), header

    @translate("Embed")
    def _run_embed(self, req, n: int, pool) -> Tuple[torch.Tensor, EmbedHeader]:
        def bad(what: str) -> FlceError:
            return FlceError("Embed", grpc.StatusCode.INTERNAL, what)

        header = rows = None
        for msg in self._embed(req, timeout=self.timeout):
            if isinstance(msg, wire.EmbedRowsView):
                if header is None:
                    raise bad("rows before the header")
                if msg.num_tokens * header.hidden_size * rows.tensor.element_size() \
                        != len(msg.data):
                    raise bad(f"rows at token {msg.token_offset} say {msg.num_tokens} tokens "
                              f"but carry {len(msg.data)} bytes")
                _put("Embed", rows, msg.token_offset, msg.data)
            elif msg.WhichOneof("msg") == "header":
                if header is not None:
                    raise bad("second header")
                header = EmbedHeader.from_pb(msg.header)
                if header.num_tokens != n:
                    raise bad(f"header says {header.num_tokens} tokens, {n} were sent")
                if req.dtype not in (pb.DTYPE_UNSPECIFIED, header.dtype):
                    raise bad(f"rows of {header.dtype.name} where DType {req.dtype} was asked")
                rows = tensors.RowAssembler(n, header.hidden_size,
                                            tensors.torch_dtype(header.dtype), pool)
        if header is None:
            raise bad("stream ended without a header")
        if not rows.complete:
            raise bad(f"{rows.rows_filled} of {n} rows received")
        return rows.tensor, header

    @_after_commits
    def embed_grad(self, head_id: str, token_ids: torch.Tensor, grad_rows: torch.Tensor, *,
                   session_id: Optional[str] = None, padding_idx: Optional[int] = None,
                   deterministic: bool = False, request_id: Optional[str] = None,
                   expected_head_version: Optional[int] = None) -> EmbedGradSummary:
        """Adds the embedding's gradient into the session's grad_W, where the head's own
        gradient (compute) accumulates, so that one step applies both: grad_rows[i] (fp32,
        fp16 or bf16; [*token_ids.shape, H] or [N, H]) is added to row token_ids[i], except
        for ids equal to padding_idx (negative counts from V, as torch's). deterministic
        sums repeated ids in token order, bit for bit the same every time. Rows go out in
        chunk_bytes pieces, then the end message: a call cut short lands nothing.

        Retry-safe: the request id (generated when not given) comes back in
        FlceError.request_id when the call fails; repeated with it and the same rows, the
        call is answered `replayed` and applies nothing again (other rows under that id are
        INVALID_ARGUMENT). Rows that are not finite are INVALID_ARGUMENT, nothing landed;
        so is an empty call (no tokens)."""
        n = token_ids.numel()
        if grad_rows.dim() < 1:
            raise ValueError("grad_rows must be [*token_ids.shape, H] or [N, H]")
        h = grad_rows.shape[-1]
        if tuple(grad_rows.shape[:-1]) != tuple(token_ids.shape) and \
                tuple(grad_rows.shape) != (n, h):
            raise ValueError(f"grad_rows {tuple(grad_rows.shape)} does not match token_ids "
                             f"{tuple(token_ids.shape)}: need [*token_ids.shape, H] or [N, H]")
        if h < 1:
            raise ValueError(f"grad_rows has no columns: {tuple(grad_rows.shape)}")
        request_id = request_id or new_request_id()
        try:
            header = pb.EmbedGradHeader(
                request_id=request_id, head_id=head_id,
                session_id=session_id if session_id is not None else self.session_id,
                num_tokens=n, token_ids=_token_ids_bytes("EmbedGrad", token_ids),
                dtype=tensors.wire_dtype(grad_rows.dtype), deterministic=deterministic)
            if padding_idx is not None:
                header.padding_idx = padding_idx
            if expected_head_version is not None:
                header.expected_head_version = expected_head_version
            rows = tensors.host_contiguous(grad_rows.reshape(n, h))

            def requests():
                yield pb.EmbedGradRequest(header=header)
                for row, piece in tensors.row_chunks(rows, self.chunk_bytes):
                    yield wire.encode_embed_grad_rows(row, len(piece) // (h * rows.element_size()),
                                                      piece)
                # Only this says "done": the server lands nothing from a stream that stops.
                yield wire.encode_embed_grad_end(n)

            return self._run_embed_grad(requests())
        except FlceError as err:
            err.request_id = request_id  # a retry with it is never applied twice
            raise

    @translate("EmbedGrad")
    def _run_embed_grad(self, requests: Iterable) -> EmbedGradSummary:
        self._prepare_bulk_call()
        return EmbedGradSummary.from_pb(self._embed_grad(requests, timeout=self.timeout))

    # ----------------------------------------------------------- checkpoints --
    @_after_commits
    def save_checkpoint(self, head_id: str, name: str, *, overwrite: bool = False,
                        request_id: Optional[str] = None) -> CheckpointInfo:
        """Saves the head with its optimizer state (weight, bias, fp32 master, moments, step
        count, version, hyper-parameters; not the sessions' gradients: save between steps)
        as `<name>.safetensors` in the caller's directory under the server's
        --checkpoint-dir (capability "checkpoint"; FAILED_PRECONDITION without one). name:
        1-128 of [A-Za-z0-9._-] starting with a letter or digit. An existing name is
        ALREADY_EXISTS unless overwrite.

        Retry-safe: the request id (generated when not given) comes back in
        FlceError.request_id when the call fails; a save repeated with it returns the first
        outcome (replayed) and writes nothing, so it needs no overwrite. The server does
        not compare a repeat's name: a new save needs a new request id."""
        request_id = request_id or new_request_id()
        req = pb.SaveCheckpointRequest(head_id=head_id, name=name, request_id=request_id,
                                       overwrite=overwrite)
        try:
            return self._save_checkpoint(req)
        except FlceError as err:
            err.request_id = request_id
            raise

    @translate("SaveCheckpoint")
    def _save_checkpoint(self, req) -> CheckpointInfo:
        return CheckpointInfo.from_pb(self._stub.SaveCheckpoint(req, timeout=self.timeout))

    @_after_commits
    def load_checkpoint(self, head_id: str, name: str, *, reset_optimizer: bool = False,
                        request_id: Optional[str] = None) -> HeadInfo:
        """Creates or replaces head_id from the caller's checkpoint `name`: weight, bias and,
        when it was saved with them, the optimizer state and step count (HeadInfo.source
        "checkpoint:<name>"; the version is at least the saved one, above every version the
        head had on this server). Replacing a head that has optimizer state needs
        reset_optimizer, as an upload does (FAILED_PRECONDITION otherwise); a missing name
        is NOT_FOUND. Sessions keep their gradients: zero them first if they are stale.

        Retry-safe: the request id (generated when not given) comes back in
        FlceError.request_id when the call fails; a load repeated with it while the head is
        still the one it loaded changes nothing."""
        request_id = request_id or new_request_id()
        req = pb.LoadCheckpointRequest(head_id=head_id, name=name,
                                       reset_optimizer=reset_optimizer, request_id=request_id)
        try:
            return self._load_checkpoint(req)
        except FlceError as err:
            err.request_id = request_id
            raise

    @translate("LoadCheckpoint")
    def _load_checkpoint(self, req) -> HeadInfo:
        return HeadInfo.from_pb(self._stub.LoadCheckpoint(req, timeout=self.timeout))
