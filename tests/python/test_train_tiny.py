"""The example trains a tiny LM with a local and a flce-served head: same loss curve."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO

EXAMPLE = REPO / "client" / "python" / "examples" / "train_tiny.py"


def test_remote_and_local_heads_give_the_same_loss_curve(server_target):
    run = subprocess.run([sys.executable, str(EXAMPLE), "--target", server_target,
                          "--steps", "40", "--log-every", "10", "--bias", "--window", "10"],
                         capture_output=True, text=True, timeout=540)
    print(run.stdout, run.stderr)
    assert run.returncode == 0
    assert "SAME CURVE" in run.stdout
    final = [line for line in run.stdout.splitlines() if line.startswith("  39 ")]
    assert len(final) == 1
    local, remote = map(float, final[0].split()[1:3])
    assert local < 3.5 and remote < 3.5  # it trained: the first loss is ln(49) ≈ 3.9
