"""scripts/check_includes.py on small trees: it refuses an include from a folder above,
and from an area the includer does not build on, and passes the allowed ones."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(os.environ.get("FLCE_SOURCE_DIR", pathlib.Path(__file__).parents[2])) \
    / "scripts" / "check_includes.py"


def run(tree: dict[str, str], tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    for name, text in tree.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                          text=True)


BASE = {
    "core/dtype.h": "",
    "kernels/engine.h": '#include "core/dtype.h"\n',
    "kernels/cuda/base/cuda_status.h": "",
    "kernels/cuda/ops/gemm.h": '#include "kernels/cuda/base/cuda_status.h"\n',
    "kernels/cuda/plans/plans.h": '#include "kernels/cuda/ops/gemm.h"\n',
    "server/state/session_store.h": '#include "kernels/engine.h"\n',
    "server/rpc/compute_reactor.h": '#include "server/state/session_store.h"\n',
    "client/cpp/client.h": '#include "core/dtype.h"\n',
}


def test_the_layers_as_drawn_pass(tmp_path):
    result = run(BASE, tmp_path)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("name,text,why", [
    ("kernels/cuda/ops/bad.h", '#include "kernels/cuda/plans/plans.h"\n',
     "kernels/cuda/plans/ is above kernels/cuda/ops/"),
    ("server/state/bad.h", '#include "server/rpc/compute_reactor.h"\n',
     "server/rpc/ is above server/state/"),
    ("client/cpp/bad.h", '#include "kernels/engine.h"\n', "client/ may include only"),
    ("core/bad.h", '#include "kernels/engine.h"\n', "core/ may include only core"),
    ("server/rpc/bad.h", '#include "kernels/cuda/plans/plans.h"\n', "server/ may include only"),
])
def test_an_include_across_the_layers_fails(tmp_path, name, text, why):
    result = run({**BASE, name: text}, tmp_path)
    assert result.returncode == 1
    assert f"{name}: includes" in result.stdout and why in result.stdout
