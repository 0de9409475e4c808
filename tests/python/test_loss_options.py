"""flce.loss_options names the loss options once: every option reaches the Compute header,
and every surface that takes them (Client.compute, RemoteLMHead, its forward and submit)
follows LossOptions. Also: the head's module and its optimizer's do not import each other."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import flce
from flce import loss_options
from flce._pb import pb
from flce.loss_options import NAMES, LossOptions

PKG = Path(flce.__file__).resolve().parent


def _changed(field: dataclasses.Field):
    """A value other than the field's default."""
    if field.name == "strategy":
        return next(k for k in loss_options.STRATEGIES if k != field.default)
    return field.default + (7 if isinstance(field.default, int) else 0.25)


def _header(options: LossOptions, **kw) -> bytes:
    header = pb.ComputeHeader(head_id="h")
    options.fill(header, **kw)
    return header.SerializeToString()


@pytest.mark.parametrize("field", dataclasses.fields(LossOptions), ids=lambda f: f.name)
def test_every_option_reaches_the_header(field):
    """An option that LossOptions.fill leaves out would never reach the server."""
    changed = LossOptions().updated({field.name: _changed(field)})
    assert _header(changed) != _header(LossOptions())


def test_every_wire_option_has_a_python_spelling():
    """The reverse: a field of flce.v1.LossOptions that no Python option (nor fill's
    grad_scale) writes could not be asked for from Python, though the server and the CLI
    take it from core's table."""
    base = pb.ComputeHeader()
    LossOptions().fill(base)
    wire = [f.name for f in pb.LossOptions.DESCRIPTOR.fields]
    written = set()
    for field in dataclasses.fields(LossOptions):
        header = pb.ComputeHeader()
        LossOptions().updated({field.name: _changed(field)}).fill(header)
        written |= {name for name in wire
                    if getattr(header.options, name) != getattr(base.options, name)}
    header = pb.ComputeHeader()
    LossOptions().fill(header, grad_scale=0.25)
    written |= {name for name in wire if getattr(header.options, name) == 0.25}
    assert written == set(wire)


def test_defaults_are_the_servers_defaults():
    """The defaults leave the optional fields unset and the options present, as sent
    before LossOptions existed."""
    header = pb.ComputeHeader()
    LossOptions().fill(header)
    assert header.HasField("options") and header.HasField("ignore_index")
    assert not header.options.HasField("temperature")
    assert not header.options.HasField("grad_scale")
    assert (header.reduction, header.strategy, header.ignore_index) == (
        pb.REDUCTION_MEAN, pb.STRATEGY_AUTO, -100)
    LossOptions(temperature=0.5).fill(header, "sum", grad_scale=0.25)
    assert header.options.temperature == 0.5 and header.options.grad_scale == 0.25
    assert header.reduction == pb.REDUCTION_SUM


def _keywords(func) -> dict:
    return {name: p.default for name, p in inspect.signature(func).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_every_surface_takes_every_option():
    defaults = LossOptions().keywords()
    for func in (flce.Client.compute, flce.RemoteLMHead.__init__):
        assert {k: v for k, v in _keywords(func).items() if k in NAMES} == defaults, func
    for func in (flce.RemoteLMHead.forward, flce.RemoteLMHead.submit):
        assert {k: v for k, v in _keywords(func).items() if k in NAMES} == \
            dict.fromkeys(NAMES), func


def test_the_head_keeps_its_options_as_attributes():
    client = flce.Client("127.0.0.1:1")
    try:
        head = flce.RemoteLMHead(client, "h", label_smoothing=0.1, strategy="chunked")
        assert {name: getattr(head, name) for name in NAMES} == LossOptions(
            label_smoothing=0.1, strategy="chunked").keywords()
        head.z_loss = 1e-4  # an attribute set later reaches the next call
        cfg = head._config({"temperature": 0.5, "softcap": None})
        assert cfg.loss == LossOptions(label_smoothing=0.1, strategy="chunked", z_loss=1e-4,
                                       temperature=0.5)
        with pytest.raises(TypeError, match="unknown loss options"):
            flce.RemoteLMHead(client, "h", lable_smoothing=0.1)
        with pytest.raises(ValueError, match="reduction must be one of"):
            flce.RemoteLMHead(client, "h", reduction="avg")
    finally:
        client.close()


def _flce_imports(module: str) -> set:
    tree = ast.parse((PKG / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("flce.")}


def test_the_optimizer_does_not_import_the_head():
    """flce.module imports flce.optim (a head makes its ServerOptimizer); flce.optim knows
    the head by what it uses of it, even under TYPE_CHECKING or inside a function."""
    assert "flce.optim" in _flce_imports("module")
    assert not _flce_imports("optim") & {"flce.module", "flce.clip"}
