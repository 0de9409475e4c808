#!/usr/bin/python3
"""A live check of the metrics contract: starts flce-server (CPU engine, free ports,
--metrics-port), drives it with flce-client (health, describe, a compute on the embedded
demo head, two calls that fail), scrapes /metrics before and after, and checks

  - every metric the Grafana dashboard and the alert rules name is in the scrape, with
    the type and labels docs/METRICS.md gives it (so the dashboard shows data);
  - every metric of docs/METRICS.md is exported;
  - the counters and histograms moved by the right amounts: flce_requests_total by rpc
    and code, flce_request_duration_seconds and flce_engine_duration_seconds counts,
    flce_tokens_total, bytes sent; the gauges (heads, head bytes, sessions, in-flight,
    workspace, GPU memory on the CPU engine) hold the values the calls imply.

Usage: live_metrics_test.py --root SRC --server BIN --client BIN
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flce_contract as fc  # noqa: E402

FLCE_RPCS = ["UploadHead", "LoadHeadFromFile", "DescribeHead", "ListHeads", "UnloadHead",
             "Compute", "Commit", "FetchGrad", "ZeroGrad", "ListSessions", "DeleteSession",
             "GetServerInfo"]
TOKENS = 48
SESSION = "deploy-live-test"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, workdir):
        self.port = free_port()
        self.metrics_port = free_port()
        while self.metrics_port == self.port:
            self.metrics_port = free_port()
        self.log_path = os.path.join(workdir, "server.log")
        self.log = open(self.log_path, "w")
        self.argv = [binary, "--port", str(self.port), "--metrics-port", str(self.metrics_port),
                     "--device", "cpu"]
        print("starting:", " ".join(self.argv), flush=True)
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)

    def alive(self):
        return self.proc.poll() is None

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Client:
    def __init__(self, binary, port):
        self.binary = binary
        self.target = f"127.0.0.1:{port}"

    def __call__(self, *args, timeout=120):
        # messages, whose bytes the dashboard counts per RPC (this test's client runs as the
        # server's user, who would get shared memory by default, and a trainer elsewhere
        # would get the server's data plane)
        argv = [self.binary, "--target", self.target, "--timeout-s", "60", "--transport",
                "grpc", "--data-plane", "off", *args]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        out = p.stdout.strip()
        try:
            parsed = json.loads(out.splitlines()[-1]) if out else None
        except ValueError:
            parsed = None
        print(f"$ flce-client {' '.join(args)} -> exit {p.returncode}: {out[:300]}"
              f"{(' / ' + p.stderr.strip()[:300]) if p.stderr.strip() else ''}", flush=True)
        return p.returncode, parsed, out + p.stderr


def healthcheck_argv(root):
    """The Dockerfile's HEALTHCHECK command (exec form), as an argv."""
    import deploy_checks
    text = open(os.path.join(root, "Dockerfile"), encoding="utf-8").read()
    for instruction, args in deploy_checks.dockerfile_instructions(text):
        if instruction == "HEALTHCHECK" and "CMD" in args:
            return deploy_checks.exec_form(args.split("CMD", 1)[1].strip())
    return None


def run_healthcheck(argv, client_binary, port):
    argv = [client_binary] + [a.replace("127.0.0.1:50051", f"127.0.0.1:{port}") for a in argv[1:]]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30)
    print(f"$ HEALTHCHECK {' '.join(argv[1:])} -> exit {p.returncode}: {p.stdout.strip()[:200]}",
          flush=True)
    return p.returncode


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode("utf-8")
    return fc.parse_exposition(text)


def find_int(obj, *keys):
    """The first integer under any of keys, searched through nested JSON."""
    if isinstance(obj, dict):
        for k in keys:
            if k in obj:
                try:
                    return int(obj[k])
                except (TypeError, ValueError):
                    pass
        for v in obj.values():
            r = find_int(v, *keys)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find_int(v, *keys)
            if r is not None:
                return r
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--client", required=True)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    c = fc.Checks("deploy live metrics")

    contract = fc.read_metrics_contract(root)
    allowed = fc.series_names(contract)
    wanted = set()  # families the dashboard and rules read
    for n in fc.dashboard_metric_names(fc.load_dashboard(root)):
        wanted.add(allowed.get(n, n))
    for _, expr in fc.rules_expressions(root):
        for n in fc.rule_metric_names(expr):
            wanted.add(allowed.get(n, n))

    with tempfile.TemporaryDirectory(prefix="flce-deploy-") as work:
        server = Server(args.server, work)
        client = Client(args.client, server.port)
        hc = None
        try:
            # Wait for SERVING (the same command as the image's HEALTHCHECK).
            deadline = time.time() + 90
            healthy = False
            while time.time() < deadline:
                if not server.alive():
                    break
                rc, _, _ = client("health", timeout=20)
                if rc == 0:
                    healthy = True
                    break
                time.sleep(0.25)
            if not c.check(healthy, "flce-server did not become SERVING within 90 s"):
                print(server.log_text())
                return c.finish()
            # Whether the server names a Unix socket to callers on its host (its default):
            # flce::Client then asks GetServerInfo once more, through the socket.
            _, server_info, _ = client("server-info")
            names_socket = bool(isinstance(server_info, dict) and server_info.get("unix_socket"))
            try:
                _, before = scrape(server.metrics_port)
            except OSError as e:
                c.check(False, f"cannot scrape /metrics on port {server.metrics_port}: {e}")
                print(server.log_text())
                return c.finish()

            # 1. health again, as the image's HEALTHCHECK runs it: a non-Flce RPC.
            hc = healthcheck_argv(root)
            if c.check(bool(hc), "the Dockerfile has no exec-form HEALTHCHECK CMD"):
                c.check(run_healthcheck(hc, args.client, server.port) == 0,
                        "the Dockerfile's HEALTHCHECK command fails on a SERVING server")
            else:
                client("health")
            # 2. describe the embedded demo head.
            rc, info, text = client("describe", "--head", "demo")
            c.check(rc == 0, f"describe --head demo failed: {text}")
            vocab = find_int(info, "vocab_size", "vocabSize") or 32000
            hidden = find_int(info, "hidden_size", "hiddenSize") or 512
            weight_bytes = find_int(info, "weight_bytes", "weightBytes")
            # 3. a compute of TOKENS tokens, bf16 on the wire, grad_input asked for.
            rng = np.random.default_rng(4)
            h = rng.standard_normal((TOKENS, hidden), dtype=np.float32)
            t = rng.integers(0, vocab, size=TOKENS).astype(np.int64)
            np.save(os.path.join(work, "h.npy"), h)
            np.save(os.path.join(work, "t.npy"), t)
            gx_path = os.path.join(work, "gx.npy")
            rc, summary, text = client("compute", "--head", "demo", "--session", SESSION,
                                       "--hidden", os.path.join(work, "h.npy"),
                                       "--targets", os.path.join(work, "t.npy"),
                                       "--dtype", "bf16", "--out-grad-input", gx_path)
            c.check(rc == 0, f"compute on the demo head failed: {text}")
            if rc == 0:
                c.check(os.path.exists(gx_path), "compute wrote no grad_input file")
            # 4. a bad call: an unknown head (NOT_FOUND).
            rc, _, text = client("describe", "--head", "no-such-head")
            c.check(rc != 0, "describe of an unknown head succeeded")
            # 5. a bad compute: rows of H+1 values (INVALID_ARGUMENT).
            np.save(os.path.join(work, "bad.npy"),
                    rng.standard_normal((TOKENS, hidden + 1), dtype=np.float32))
            rc, _, text = client("compute", "--head", "demo", "--session", SESSION,
                                 "--hidden", os.path.join(work, "bad.npy"),
                                 "--targets", os.path.join(work, "t.npy"), "--dtype", "bf16")
            c.check(rc != 0, "compute with hidden rows of the wrong size succeeded")

            # flce::Client asks for the server's message limit (GetServerInfo) before its
            # first compute, to cut chunks to it: one per flce-client compute process, and
            # one more through the server's Unix socket where it names one (the client
            # checks that the same server answers there before its compute moves to it).
            per_compute = 2 if names_socket else 1
            expected_requests = {("DescribeHead", "OK"): 1, ("DescribeHead", "NOT_FOUND"): 1,
                                 ("Compute", "OK"): 1, ("Compute", "INVALID_ARGUMENT"): 1,
                                 ("GetServerInfo", "OK"): 2 * per_compute}

            def delta(after, name, **labels):
                return fc.total(after, name, **labels) - fc.total(before, name, **labels)

            # Counters are recorded as calls finish, and gauges may be refreshed by the
            # server's periodic sweeper (every second): poll until both settle. The
            # session gauges (pending gradients back to 0 after the commit on complete,
            # nothing in flight) are among them: a scrape less than a sweep after the last
            # call may still show the state before it. The poll is bounded (15 s), so a
            # gauge that never settles still fails the checks below.
            def settled(samples):
                inflight = [v for _, v in fc.select(samples, "flce_inflight_requests")]
                return (all(delta(samples, "flce_requests_total", rpc=r, code=k) >= n
                            for (r, k), n in expected_requests.items())
                        and fc.total(samples, "flce_heads_loaded") >= 1
                        and fc.total(samples, "flce_sessions") >= 1
                        and bool(fc.select(samples, "flce_sessions_with_pending_gradients"))
                        and fc.total(samples, "flce_sessions_with_pending_gradients") == 0
                        and bool(inflight) and all(v == 0 for v in inflight)
                        and fc.total(samples, "flce_workspace_budget_bytes") > 0
                        and fc.total(samples, "flce_workspace_peak_bytes") > 0)

            after_types, after = {}, []
            deadline = time.time() + 15
            while time.time() < deadline:
                after_types, after = scrape(server.metrics_port)
                if settled(after):
                    break
                time.sleep(0.25)
            time.sleep(0.3)
            after_types, after = scrape(server.metrics_port)
        finally:
            rc = server.stop()
        c.check(rc == 0, f"flce-server exited with {rc} on SIGTERM")
        if hc:
            c.check(run_healthcheck(hc, args.client, server.port) != 0,
                    "the Dockerfile's HEALTHCHECK command succeeds with no server")
        log = server.log_text()

    # --- the contract: every family exported, with its type and labels --------------
    present = {n for n, _, _ in after}
    for fam, info in sorted(contract.items()):
        series = fam + "_bucket" if info["type"] == "histogram" else fam
        ok = c.check(series in present, f"{fam} ({info['type']}) is not in the scrape"
                     + (" (the dashboard reads it)" if fam in wanted else ""))
        if not ok:
            continue
        c.check(after_types.get(fam) == info["type"],
                f"{fam} is exported as {after_types.get(fam)}, the contract says {info['type']}")
        for labels, _ in fc.select(after, series):
            got = set(labels) - {"le"}
            c.check(got == set(info["labels"]),
                    f"{fam} has labels {sorted(got)}, the contract says {info['labels']}")
            break
    for fam in sorted(wanted):
        c.check(fam in contract, f"the dashboard reads {fam}, which is not in docs/METRICS.md")
    for n in sorted(present):
        if n.startswith("flce_"):
            c.check(n in allowed, f"the server exports {n}, which docs/METRICS.md does not list")

    # --- counters and histograms moved by the right amounts -------------------------
    for (rpc, code), n in sorted(expected_requests.items()):
        d = delta(after, "flce_requests_total", rpc=rpc, code=code)
        c.check(d == n, f"flce_requests_total{{rpc={rpc},code={code}}} moved by {d:g}, want {n}")
    for rpc in FLCE_RPCS:
        want = sum(n for (r, _), n in expected_requests.items() if r == rpc)
        d = delta(after, "flce_requests_total", rpc=rpc)
        c.check(d == want, f"flce_requests_total{{rpc={rpc}}} moved by {d:g}, want {want}")
        d = delta(after, "flce_request_duration_seconds_count", rpc=rpc)
        c.check(d == want,
                f"flce_request_duration_seconds_count{{rpc={rpc}}} moved by {d:g}, want {want}")
        if want:
            d = delta(after, "flce_request_duration_seconds_bucket", rpc=rpc, le="+Inf")
            c.check(d == want, f"flce_request_duration_seconds_bucket{{rpc={rpc},le=+Inf}} "
                               f"moved by {d:g}, want {want}")
            d = delta(after, "flce_request_duration_seconds_sum", rpc=rpc)
            c.check(d > 0, f"flce_request_duration_seconds_sum{{rpc={rpc}}} did not grow")
    # Histogram buckets are cumulative.
    for fam in ("flce_request_duration_seconds", "flce_engine_duration_seconds"):
        groups = {}
        for labels, v in fc.select(after, fam + "_bucket"):
            key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            groups.setdefault(key, []).append((float(labels["le"]), v))
        for key, buckets in groups.items():
            values = [v for _, v in sorted(buckets)]
            c.check(values == sorted(values), f"{fam}{dict(key)} buckets are not cumulative")
            c.check(sorted(buckets)[-1][0] == float("inf"), f"{fam}{dict(key)} has no +Inf bucket")

    d = delta(after, "flce_tokens_total")
    c.check(d == TOKENS, f"flce_tokens_total moved by {d:g}, want {TOKENS} (the one good compute)")
    d = delta(after, "flce_tokens_total", head="demo")
    c.check(d == TOKENS, f"flce_tokens_total{{head=demo}} moved by {d:g}, want {TOKENS}")
    strategies = {l.get("strategy") for l, _ in fc.select(after, "flce_tokens_total", head="demo")}
    c.check(all(strategies) and strategies,
            f"flce_tokens_total{{head=demo}} has no strategy label ({strategies})")
    d = delta(after, "flce_engine_duration_seconds_count")
    c.check(d == 1, f"flce_engine_duration_seconds_count moved by {d:g}, want 1 (the rejected "
                    "compute never reaches the engine)")
    d = delta(after, "flce_engine_duration_seconds_sum")
    c.check(d > 0, "flce_engine_duration_seconds_sum did not grow")
    grad_bytes = TOKENS * hidden * 2
    d = delta(after, "flce_sent_bytes_total", rpc="Compute")
    c.check(d == grad_bytes, f"flce_sent_bytes_total{{rpc=Compute}} moved by {d:g}, want "
                             f"{grad_bytes} (grad_input, {TOKENS}x{hidden} bf16)")
    d = delta(after, "flce_received_bytes_total", rpc="Compute")
    c.check(d >= TOKENS * hidden * 2, f"flce_received_bytes_total{{rpc=Compute}} moved by {d:g}, "
                                      f"want at least {TOKENS * hidden * 2} (hidden, bf16)")
    for rpc in ("DescribeHead",):
        for fam in ("flce_received_bytes_total", "flce_sent_bytes_total"):
            d = delta(after, fam, rpc=rpc)
            c.check(d == 0, f"{fam}{{rpc={rpc}}} moved by {d:g}: DescribeHead carries no tensor")

    # --- gauges ---------------------------------------------------------------------
    def gauge(name, **labels):
        return fc.total(after, name, **labels) if fc.select(after, name, **labels) else None

    c.check(gauge("flce_heads_loaded") == 1, f"flce_heads_loaded = {gauge('flce_heads_loaded')}, "
                                             "want 1 (the demo head)")
    hb = gauge("flce_head_weight_bytes", head="demo")
    want_hb = weight_bytes if weight_bytes else vocab * hidden * 2
    c.check(hb == want_hb, f"flce_head_weight_bytes{{head=demo}} = {hb}, want {want_hb}")
    c.check(gauge("flce_sessions") == 1, f"flce_sessions = {gauge('flce_sessions')}, want 1")
    c.check(gauge("flce_sessions_with_pending_gradients") == 0,
            "flce_sessions_with_pending_gradients should be 0 (commit on complete)")
    inflight = [v for _, v in fc.select(after, "flce_inflight_requests")]
    c.check(inflight and all(v == 0 for v in inflight),
            f"flce_inflight_requests should be 0 once the calls are done: {inflight}")
    budget = gauge("flce_workspace_budget_bytes")
    peak = gauge("flce_workspace_peak_bytes")
    c.check(budget is not None and budget > 0, f"flce_workspace_budget_bytes = {budget}")
    # One compute ran: the high-water mark is above 0 and within the budget.
    c.check(peak is not None and budget is not None and 0 < peak <= budget,
            f"flce_workspace_peak_bytes = {peak}, budget {budget}")
    c.check(gauge("flce_gpu_memory_used_bytes") == 0 and gauge("flce_gpu_memory_total_bytes") == 0,
            "flce_gpu_memory_*_bytes should be 0 on the CPU engine")

    rc = c.finish()
    if rc:
        print("--- server log (last 60 lines)")
        print("\n".join(log.splitlines()[-60:]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
