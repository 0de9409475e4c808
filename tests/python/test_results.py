"""The client's results are frozen, typed dataclasses named like the protobuf fields."""
from __future__ import annotations

import dataclasses
import enum
import uuid

import pytest
import torch
from torch import nn

import flce
from flce import results
from flce._pb import pb

V, H, N = 31, 16, 20


def _repeated(f) -> bool:
    """protobuf 6 replaced FieldDescriptor.label with is_repeated; Debian's 3.21 has only label."""
    return f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED


def _filled(message_name: str):
    """A message of that type with every scalar field set to a distinct non-default value,
    so that a field read from the wrong place cannot pass."""
    msg = getattr(pb, message_name)()
    for i, f in enumerate(msg.DESCRIPTOR.fields, start=1):
        if _repeated(f):
            assert f.type == f.TYPE_STRING, f"{message_name}.{f.name}: teach _filled its type"
            getattr(msg, f.name).extend([f"{f.name}-{i}", f"{f.name}-{i}-b"])
        elif f.type == f.TYPE_MESSAGE:
            getattr(msg, f.name).CopyFrom(_filled(f.message_type.name))
        elif f.type == f.TYPE_ENUM:
            setattr(msg, f.name, f.enum_type.values[-1].number)
        elif f.type == f.TYPE_BOOL:
            setattr(msg, f.name, True)
        elif f.type == f.TYPE_STRING:
            setattr(msg, f.name, f"{f.name}-{i}")
        elif f.type in (f.TYPE_FLOAT, f.TYPE_DOUBLE):
            setattr(msg, f.name, i + 0.5)
        else:
            setattr(msg, f.name, 100 + i)
    return msg


@pytest.mark.parametrize("cls", list(results.MIRRORS), ids=lambda c: c.__name__)
def test_every_protobuf_field_is_mirrored(cls):
    """A field added to the proto must be added to its result class too."""
    descriptor = getattr(pb, results.MIRRORS[cls]).DESCRIPTOR
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in descriptor.fields]
    msg = _filled(results.MIRRORS[cls])
    value = cls.from_pb(msg)
    for f in descriptor.fields:
        got = getattr(value, f.name)
        want = getattr(msg, f.name)
        if f.type == f.TYPE_MESSAGE:
            assert dataclasses.is_dataclass(got)
            assert got == type(got).from_pb(want)
        elif _repeated(f):
            assert isinstance(got, tuple) and got == tuple(want), f.name  # frozen: a tuple
        else:
            assert got == want, f.name
            if f.type == f.TYPE_ENUM:
                assert isinstance(got, enum.IntEnum), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, descriptor.fields[0].name, None)


def test_enums_match_the_proto():
    for enum_cls, proto_enum, prefix in ((results.DType, pb.DType, "DTYPE_"),
                                         (results.ContributionState, pb.ContributionState,
                                          "CONTRIBUTION_"),
                                         (results.OptimizerKind, pb.OptimizerKind,
                                          "OPTIMIZER_"),
                                         (results.StepOutcome, pb.StepOutcome, "STEP_")):
        names = {prefix + m.name: m.value for m in enum_cls}
        if enum_cls is results.StepOutcome:  # STEP_OUTCOME_UNSPECIFIED, STEP_APPLIED, ...
            names["STEP_OUTCOME_UNSPECIFIED"] = names.pop("STEP_UNSPECIFIED")
        assert names == dict(proto_enum.items())


def test_every_new_training_message_is_checked():
    """The training section's messages are mirrored, and checked by the test above."""
    mirrored = set(results.MIRRORS.values())
    for name in ("OptimizerGroup", "OptimizerInfo", "StepResponse", "GradNormResponse",
                 "GradVersions", "DownloadHeader", "CheckpointInfo"):
        assert name in mirrored, name


def test_tied_embedding_results_are_checked():
    """What Client.embed_grad returns and RemoteEmbedding.last_header holds are mirrored,
    and checked by the test above."""
    mirrored = set(results.MIRRORS.values())
    for name in ("EmbedHeader", "EmbedGradSummary"):
        assert name in mirrored, name
    assert flce.EmbedHeader is results.EmbedHeader
    assert flce.EmbedGradSummary is results.EmbedGradSummary


def test_optimizer_group_round_trips_and_leaves_unset_fields_unset():
    group = flce.OptimizerGroup(weight_decay=0.0, momentum=0.9, nesterov=True)
    msg = group.to_pb()
    assert msg.HasField("weight_decay") and msg.weight_decay == 0.0  # 0 is sent, not unset
    assert not msg.HasField("beta1") and not msg.HasField("eps")
    assert flce.OptimizerGroup.from_pb(msg) == group


def test_results_from_a_server(client):
    info = client.server_info()
    assert isinstance(info, flce.ServerInfo) and info.engine
    lin = nn.Linear(H, V, bias=True)
    head = flce.RemoteLMHead(client, f"h-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    up = head.load_from_module(lin, dtype=torch.bfloat16)
    assert isinstance(up, flce.HeadInfo)
    assert (up.vocab_size, up.hidden_size, up.has_bias) == (V, H, True)
    assert up.dtype is flce.DType.BF16 and up.dtype == pb.DTYPE_BF16
    assert client.describe_head(head.head_id) == head.info()
    assert isinstance(head.info(), flce.HeadInfo)
    assert all(isinstance(h, flce.HeadInfo) for h in client.heads())

    x = torch.randn(N, H, requires_grad=True)
    y = torch.randint(0, V, (N,))
    head(x, y).backward()
    summary = head.last_summary
    assert isinstance(summary, flce.ComputeSummary) and isinstance(summary.timings,
                                                                   flce.Timings)
    assert summary.n_valid == N and summary.staged and not summary.committed

    r = client.compute(head.head_id, x.detach(), y, session_id=head.session_id,
                       deferred_commit=True)
    assert isinstance(r.summary, flce.ComputeSummary) and r.loss == r.summary.loss
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.summary.loss = 0.0

    sessions = client.sessions(head.head_id)
    assert sessions and all(isinstance(s, flce.SessionInfo) for s in sessions)
    g = head.fetch_grad(reset=True)
    assert isinstance(g.header, flce.GradHeader)
    assert g.header.dtype is flce.DType.FP32 and g.header.contributions == 1
    gone = client.unload_head(head.head_id)
    assert isinstance(gone, flce.UnloadResult) and gone.head.head_id == head.head_id


def test_commit_result(client):
    lin = nn.Linear(H, V, bias=False)
    head = flce.RemoteLMHead(client, f"h-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lin, dtype=torch.float32)
    rid = uuid.uuid4().hex
    x, y = torch.randn(N, H), torch.randint(0, V, (N,))
    r = client.compute(head.head_id, x, y, session_id=head.session_id, request_id=rid,
                       deferred_commit=True)
    assert r.summary.staged
    done = client.commit(head.head_id, rid, 0.5, session_id=head.session_id)
    assert isinstance(done, flce.CommitResult)
    assert done.state is flce.ContributionState.COMMITTED and done.scale == 0.5
    assert not done.replayed
    assert head.fetch_grad().header.contributions == 1
    client.unload_head(head.head_id)
