"""The example trains a tiny LM with a local and a flce-served head: same loss curve; and
with the head trained on the server, the same curve without weights or gradients on the
wire; and with the input embedding tied to the head and kept on the server too
(flce.RemoteEmbedding), the local tied model's curve, still without weights or gradients
on the wire."""
from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

from conftest import REPO, RealServer, free_port

EXAMPLE = REPO / "client" / "python" / "examples" / "train_tiny.py"


def _run(target: str, *extra: str) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, str(EXAMPLE), "--target", target,
                          "--steps", "40", "--log-every", "10", "--bias", "--window", "10",
                          *extra], capture_output=True, text=True, timeout=540)
    print(run.stdout, run.stderr)
    assert run.returncode == 0
    assert "SAME CURVE" in run.stdout
    final = [line for line in run.stdout.splitlines() if line.startswith("  39 ")]
    assert len(final) == 1
    local, remote = map(float, final[0].split()[1:3])
    assert local < 3.5 and remote < 3.5  # it trained: the first loss is ln(49) ≈ 3.9
    return run


def test_remote_and_local_heads_give_the_same_loss_curve(server_target):
    _run(server_target)


def _counter(metrics_url: str, name: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as page:
        text = page.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_head_trained_on_the_server_gives_the_same_curve_without_weights_on_the_wire(
        real_server_bin):
    port = free_port()
    # messages: the Compute bytes then show in the scrape (regions would carry them unseen)
    srv = RealServer(real_server_bin, "--metrics-port", str(port), "--metrics-host",
                     "127.0.0.1", "--local-transports=none")
    url = f"http://127.0.0.1:{port}/metrics"
    upload, fetch, compute = ('flce_received_bytes_total{rpc="UploadHead"}',
                              'flce_sent_bytes_total{rpc="FetchGrad"}',
                              'flce_received_bytes_total{rpc="Compute"}')
    try:
        run = _run(srv.target, "--server-optimizer", "--metrics-url", url)
        # what the example scraped after its first and its last step
        grew = dict(re.findall(r"^metrics from step 0 to step 39: (\S+) \+(\d+)$",
                               run.stdout, re.M))
        assert set(grew) == {upload, fetch, compute}, run.stdout
        assert int(grew[upload]) == 0 and int(grew[fetch]) == 0
        assert int(grew[compute]) > 0, "the scrape saw no traffic at all"
        # and the server's totals: one upload (49 x 64 weight and a bias, fp32), no fetch
        vocab = int(re.search(r"vocabulary (\d+)", run.stdout).group(1))
        assert _counter(url, upload) == (vocab * 64 + vocab) * 4
        assert _counter(url, fetch) == 0
    finally:
        srv.stop()


def test_tied_embedding_trained_on_the_server_gives_the_local_tied_curve(real_server_bin):
    """--tied: the embedding is the head's weight, looked up (Embed) and trained (EmbedGrad,
    one Step with the head's gradient) on the server; the local run ties nn.Embedding to
    lm_head. Same curve (1e-2 smoothed), and the weight never crosses the wire after the
    first upload: UploadHead, FetchGrad and DownloadHead do not grow."""
    port = free_port()
    srv = RealServer(real_server_bin, "--metrics-port", str(port), "--metrics-host",
                     "127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    upload, fetch, download = ('flce_received_bytes_total{rpc="UploadHead"}',
                               'flce_sent_bytes_total{rpc="FetchGrad"}',
                               'flce_sent_bytes_total{rpc="DownloadHead"}')
    embed, embed_grad = ('flce_sent_bytes_total{rpc="Embed"}',
                         'flce_received_bytes_total{rpc="EmbedGrad"}')
    try:
        run = _run(srv.target, "--tied", "--metrics-url", url)
        assert "tied embedding" in run.stdout
        grew = dict(re.findall(r"^metrics from step 0 to step 39: (\S+) \+(\d+)$",
                               run.stdout, re.M))
        assert {upload, fetch, download, embed, embed_grad} <= set(grew), run.stdout
        assert int(grew[upload]) == 0 and int(grew[fetch]) == 0 and int(grew[download]) == 0
        # 39 steps of 16 x 64 ids: fp32 rows of H = 64 down, their gradient up
        rows = 39 * 16 * 64 * 64 * 4
        assert int(grew[embed]) == rows
        assert int(grew[embed_grad]) >= rows
        vocab = int(re.search(r"vocabulary (\d+)", run.stdout).group(1))
        assert _counter(url, upload) == (vocab * 64 + vocab) * 4  # the one upload
        assert _counter(url, fetch) == 0 and _counter(url, download) == 0
    finally:
        srv.stop()
