"""An in-process Python implementation of the flce.v1.Flce service, for client tests.

It computes MATH.md's formulas in float64 with torch autograd over materialised logits
(tiny shapes only), so the client's plans (fused, per-token, deferred commits, chunk
assembly) can be tested where no flce-server binary is built. It is a test double: the
real server is tested by the same tests whenever FLCE_SERVER_BIN is set.
"""
from __future__ import annotations

import threading
import uuid
from concurrent import futures

import grpc
import torch

from flce import tensors
from flce._pb import pb, pb_grpc


def _has(msg, name: str) -> bool:
    """Whether `name` is set on msg; True for a field without presence or one the
    generated class does not know yet (then its value, or its default, is what counts)."""
    try:
        return msg.HasField(name)
    except ValueError:
        return True


def _tensor(data: bytes, wire_dtype: int, shape) -> torch.Tensor:
    return tensors.from_bytes(data, tensors.torch_dtype(wire_dtype), shape)


def reference(h, w, b, y, *, ignore_index=-100, eps=0.0, s=0.0, c=0.0, tau=1.0,
              reduction=pb.REDUCTION_MEAN, token_weights=None, entropy_weights=None,
              grad_scale=1.0):
    """MATH.md in float64: returns (loss, z_loss, n_valid, per-token dict, dh, dW, db)."""
    h = h.to(torch.float64).requires_grad_(True)
    w = w.to(torch.float64).requires_grad_(True)
    b = b.to(torch.float64).requires_grad_(True) if b is not None else None
    r = h @ w.T + (b if b is not None else 0)
    u = c * torch.tanh(r / c) if c > 0 else r
    z = u / tau
    lse = torch.logsumexp(z, dim=1)
    valid = y != ignore_index
    ys = torch.where(valid, y, torch.zeros_like(y)).long()
    zy = z.gather(1, ys[:, None])[:, 0]
    v = z.shape[1]
    zl = s * lse ** 2
    ell = torch.where(valid, lse - (1 - eps) * zy - eps / v * z.sum(1) + zl, torch.zeros_like(lse))
    p = torch.softmax(z, dim=1)
    ent = lse - (p * z).sum(1)
    n_valid = int(valid.sum())
    if token_weights is not None:
        a = token_weights.to(torch.float64)
    elif reduction == pb.REDUCTION_MEAN:
        a = torch.full_like(lse, 1.0 / n_valid if n_valid else 0.0)
    else:
        a = torch.ones_like(lse)
    a = torch.where(valid, a, torch.zeros_like(a))
    e = entropy_weights.to(torch.float64) if entropy_weights is not None else torch.zeros_like(a)
    total = grad_scale * ((a * ell).sum() + (e * ent).sum())
    total.backward()
    per_token = {"loss": ell.detach(), "entropy": ent.detach(),
                 "logprob": torch.where(valid, zy - lse, torch.zeros_like(lse)).detach(),
                 "correct": (valid & (z.argmax(1) == ys)).to(torch.uint8)}
    loss = float((a * ell).sum().detach())
    z_loss = float((a * torch.where(valid, zl, torch.zeros_like(zl))).sum().detach())
    return (loss, z_loss, n_valid, per_token, h.grad, w.grad,
            b.grad if b is not None else None)


class FakeFlce(pb_grpc.FlceServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.heads = {}      # id -> dict(w, b, info)
        self.grads = {}      # (head, session) -> [dW, db, contributions]
        self.staged = {}     # (head, session, request) -> (dW, db)
        self.fetched = {}    # (head, session, request) -> (dW, db, contributions): reset fetches
        self.requests = []   # every request message as received (Commit, FetchGrad, headers)

    def UploadHead(self, request_iterator, context):
        header, parts = None, {pb.TENSOR_WEIGHT: bytearray(), pb.TENSOR_BIAS: bytearray()}
        for req in request_iterator:
            if req.WhichOneof("msg") == "header":
                header = req.header
            else:
                buf = parts[req.chunk.role]
                if req.chunk.byte_offset != len(buf):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "chunk.byte_offset")
                buf += req.chunk.data
        v, hsz = header.vocab_size, header.hidden_size
        w = _tensor(bytes(parts[pb.TENSOR_WEIGHT]), header.dtype, (v, hsz))
        b = _tensor(bytes(parts[pb.TENSOR_BIAS]), header.dtype, (v,)) if header.has_bias else None
        with self.lock:
            old = self.heads.get(header.head_id)
            info = pb.HeadInfo(head_id=header.head_id, vocab_size=v, hidden_size=hsz,
                               dtype=header.dtype, has_bias=header.has_bias,
                               version=old["info"].version + 1 if old else 1, source="upload")
            self.heads[header.head_id] = {"w": w, "b": b, "info": info}
        return info

    def DescribeHead(self, request, context):
        head = self.heads.get(request.head_id)
        if head is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"head_id {request.head_id}")
        return head["info"]

    def ListHeads(self, request, context):
        return pb.ListHeadsResponse(heads=[h["info"] for h in self.heads.values()])

    def UnloadHead(self, request, context):
        with self.lock:
            head = self.heads.pop(request.head_id, None)
        if head is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"head_id {request.head_id}")
        return pb.UnloadHeadResponse(head=head["info"])

    def Compute(self, request_iterator, context):
        it = iter(request_iterator)
        header = next(it).header
        head = self.heads.get(header.head_id)
        if head is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"head_id {header.head_id}")
        self.requests.append(header)
        n, hsz = header.num_tokens, head["info"].hidden_size
        given = getattr(header, "hidden_size", 0)  # 0: not given (or a class without it)
        if given and given != hsz:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"hidden_size {given} does not match head {header.head_id}'s {hsz}")
        dtype = tensors.torch_dtype(header.hidden_dtype)
        asm = tensors.RowAssembler(n, hsz, dtype)
        ended = False
        for req in it:
            if ended:  # as the real server: the end message is the last one
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "a message after the end message: nothing landed")
            if req.WhichOneof("msg") == "end":
                ended = True
                continue
            asm.put(req.hidden.token_offset, req.hidden.data)
        if not ended:  # as the real server: a stream that just stops lands nothing
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "the request stream ended without an end message")
        y = tensors.from_bytes(header.targets, torch.int32, (n,)).long()
        opts, outs = header.options, header.outputs
        ignore = header.ignore_index if header.HasField("ignore_index") else -100
        bad = ((y < 0) | (y >= head["info"].vocab_size)) & (y != ignore)
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"targets[{t}] = {int(y[t])} is outside [0, {head['info'].vocab_size})")
        tw = (tensors.from_bytes(header.token_weights, torch.float32, (n,))
              if header.token_weights else None)
        ew = (tensors.from_bytes(header.entropy_weights, torch.float32, (n,))
              if header.entropy_weights else None)
        if header.reduction == pb.REDUCTION_NONE and tw is None:
            tw = torch.ones(n)
        grad_scale = opts.grad_scale if opts.HasField("grad_scale") else 1.0
        loss, z_loss, n_valid, per_token, dh, dw, db = reference(
            asm.tensor, head["w"], head["b"], y,
            ignore_index=header.ignore_index if header.HasField("ignore_index") else -100,
            eps=opts.label_smoothing, s=opts.z_loss_scale, c=opts.softcap,
            tau=opts.temperature if opts.HasField("temperature") else 1.0,
            reduction=header.reduction, token_weights=tw, entropy_weights=ew,
            grad_scale=grad_scale)
        want_gi = (outs.grad_input if outs.HasField("grad_input") else True) and not outs.forward_only
        if want_gi:
            gi = dh.to(dtype).contiguous()
            for row, piece in tensors.row_chunks(gi, 1000):  # small chunks: test assembly
                yield pb.ComputeResponse(grad_input=pb.GradInputChunk(
                    token_offset=row, num_tokens=len(piece) // (hsz * gi.element_size()),
                    data=piece.tobytes()))
        fields = {k: getattr(outs, "per_token_loss" if k == "loss" else
                             "accuracy" if k == "correct" else k)
                  for k in ("loss", "logprob", "entropy", "correct")}
        if any(fields.values()):
            chunk = pb.TokenOutputsChunk(token_offset=0, num_tokens=n)
            for k, on in fields.items():
                if on:
                    t = per_token[k].to(torch.uint8 if k == "correct" else torch.float32)
                    setattr(chunk, k, tensors.byte_view(t.contiguous()).tobytes())
            yield pb.ComputeResponse(token_outputs=chunk)
        summary = pb.ComputeSummary(loss=loss, n_valid=n_valid, z_loss=z_loss, engine="fake",
                                    entropy_sum=float(per_token["entropy"].sum())
                                    if outs.entropy else 0.0)
        if not outs.forward_only:
            key = (header.head_id, header.session_id)
            contribution = (dw.to(torch.float32), db.to(torch.float32) if db is not None else None)
            with self.lock:
                if header.commit == pb.COMMIT_DEFERRED:
                    self.staged[key + (header.request_id,)] = contribution
                    summary.staged = True
                else:
                    self._add(key, contribution, 1.0)
                    summary.committed = True
        yield pb.ComputeResponse(summary=summary)

    def _add(self, key, contribution, scale):
        dw, db = contribution
        acc = self.grads.setdefault(key, [torch.zeros_like(dw),
                                          torch.zeros_like(db) if db is not None else None, 0])
        acc[0] += scale * dw
        if db is not None:
            acc[1] += scale * db
        acc[2] += 1

    def Commit(self, request, context):
        self.requests.append(request)
        key = (request.head_id, request.session_id)
        scale = request.scale if _has(request, "scale") else 1.0
        with self.lock:
            staged = self.staged.pop(key + (request.request_id,), None)
            if staged is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"request_id {request.request_id}")
            if request.discard:
                return pb.CommitResponse(state=pb.CONTRIBUTION_DISCARDED)
            self._add(key, staged, scale)
        return pb.CommitResponse(state=pb.CONTRIBUTION_COMMITTED, scale=scale)

    def FetchGrad(self, request, context):
        self.requests.append(request)
        head = self.heads[request.head_id]["info"]
        key = (request.head_id, request.session_id)
        fetch_key = key + (request.request_id,)
        replayed = False
        with self.lock:
            v, hsz = head.vocab_size, head.hidden_size
            if request.reset and request.request_id and fetch_key in self.fetched:
                dw, db, count = self.fetched[fetch_key]  # a retried reset: the same gradient
                replayed = True
            else:
                acc = self.grads.get(key)
                dw = acc[0].clone() if acc else torch.zeros(v, hsz)
                db = (acc[1].clone() if acc and acc[1] is not None else torch.zeros(v)) \
                    if head.has_bias else None
                count = acc[2] if acc else 0
                if request.reset:
                    self.grads.pop(key, None)
                    if request.request_id:
                        self.fetched[fetch_key] = (dw, db, count)
        dtype = tensors.torch_dtype(request.dtype or pb.DTYPE_FP32)
        yield pb.FetchGradResponse(header=pb.GradHeader(
            vocab_size=v, hidden_size=hsz, dtype=tensors.wire_dtype(dtype), has_bias=head.has_bias,
            contributions=count, head_version=head.version, replayed=replayed))
        for role, t in ((pb.TENSOR_WEIGHT, dw), (pb.TENSOR_BIAS, db)):
            if t is None:
                continue
            t = t.to(dtype).reshape(t.shape[0], -1).contiguous()
            for row, piece in tensors.row_chunks(t, 4096):
                yield pb.FetchGradResponse(chunk=pb.GradChunk(
                    role=role, row_offset=row, rows=len(piece) // (t.shape[1] * t.element_size()),
                    data=piece.tobytes()))

    def ZeroGrad(self, request, context):
        with self.lock:
            self.grads.pop((request.head_id, request.session_id), None)
        return pb.ZeroGradResponse()

    def ListSessions(self, request, context):
        with self.lock:
            keys = set(self.grads) | {k[:2] for k in self.staged}
            pending = {k: sum(1 for st in self.staged if st[:2] == k) for k in keys}
        return pb.ListSessionsResponse(sessions=[
            pb.SessionInfo(head_id=h, session_id=s, pending=pending[(h, s)])
            for h, s in sorted(keys) if not request.head_id or h == request.head_id])

    def GetServerInfo(self, request, context):
        return pb.ServerInfo(instance_id=uuid.uuid4().hex, engine="fake")


def start(port: int = 0):
    """(server, port) of a running fake on 127.0.0.1."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    server.servicer = FakeFlce()
    pb_grpc.add_FlceServicer_to_server(server.servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port
