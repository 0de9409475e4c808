#!/usr/bin/python3
"""Static checks of flce's deployment files, one group per subcommand:

  compose     docker-compose config -q on every deploy/docker-compose*.yml, and the
              structure of each (GPU reservation, --device, ipc/shm, Prometheus and
              Grafana wiring, mounted files that exist)
  prometheus  promtool check config / check rules on deploy/prometheus
  dashboard   the Grafana dashboard parses, names only metrics of docs/METRICS.md, shows
              the panels the operations guide describes, and every query is valid PromQL
              (promtool, with Grafana's variables substituted); the alert rules name only
              contract metrics; the dashboard's error panels and the error-rate alert
              leave out the same codes (OK, CANCELLED); the provisioning files point at
              the dashboard
  alerts      promtool test rules tests/deploy/alert_rules_test.yml: the alerts fire
              for the series they are meant for (one dead server among two, errors
              without client cancellations) and no others
  dockerfile  the two images' Dockerfiles (Dockerfile: CUDA on Ubuntu 24.04;
              deploy/docker/Dockerfile.cpu: Debian 12 slim, no CUDA): stages, user, ports,
              health check and entrypoint, build packages against scripts/setup.sh (and the
              same in both), and .dockerignore

Usage: deploy_checks.py --root SOURCE_DIR GROUP
Exit: 0 passed, 1 failed, 77 skipped (a tool this group needs is missing).
"""

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flce_contract as fc  # noqa: E402

COMPOSE_FILES = ["docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.same-host.yml"]
# The images: the GPU one (CUDA, Ubuntu 24.04) and the CPU one (Debian 12 slim, no CUDA).
GPU_DOCKERFILE = "Dockerfile"
CPU_DOCKERFILE = "deploy/docker/Dockerfile.cpu"
# What the two Dockerfiles share: the build package list and the build and runtime steps.
BUILD_PACKAGES = "deploy/docker/build-packages.txt"
SHARED_STEPS = ("deploy/docker/build-stage.sh", "deploy/docker/runtime-stage.sh")


def run(cmd, cwd=None, env=None):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    return p.returncode, p.stdout


# ------------------------------------------------------------------- compose --

def service_blocks(config_text):
    """{service: its block of `docker-compose config` output} (services at indent 2)."""
    blocks = {}
    in_services = False
    current = None
    for line in config_text.splitlines():
        if re.match(r"^\S", line):
            in_services = line.startswith("services:")
            current = None
            continue
        if not in_services:
            continue
        m = re.match(r"^  ([A-Za-z0-9_.-]+):\s*$", line)
        if m:
            current = m.group(1)
            blocks[current] = []
            continue
        if current:
            blocks[current].append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def check_compose(root, c):
    exe = shutil.which("docker-compose")
    if not exe:
        print("SKIP: docker-compose is not installed (scripts/setup.sh installs it): "
              "the compose files were not validated")
        return fc.SKIP
    deploy = os.path.join(root, "deploy")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLCE_", "COMPOSE_",
                                                                    "GRAFANA_", "PROMETHEUS_"))}
    for name in COMPOSE_FILES:
        path = os.path.join(deploy, name)
        if not c.check(os.path.isfile(path), f"{name} is missing"):
            continue
        rc, out = run([exe, "-f", path, "config", "-q"], cwd=deploy, env=env)
        if not c.check(rc == 0, f"docker-compose config -q {name} failed:\n{out}"):
            continue
        print(f"ok: docker-compose config -q {name}")
        rc, out = run([exe, "-f", path, "config"], cwd=deploy, env=env)
        c.check(rc == 0, f"docker-compose config {name} failed:\n{out}")
        blocks = service_blocks(out)
        c.check(set(blocks) >= {"flce-server", "prometheus", "grafana"},
                f"{name}: services are {sorted(blocks)}, want flce-server, prometheus, grafana")
        server = blocks.get("flce-server", "")
        src = open(path, encoding="utf-8").read()
        # Each variant builds its own image: the GPU files the CUDA Dockerfile, the CPU file
        # the slim Debian one (tagged differently, so that one does not replace the other).
        want_df = "Dockerfile" if name != "docker-compose.cpu.yml" else CPU_DOCKERFILE
        m = re.search(r"^\s*context: (\S+)\s*$", server, re.M)
        d = re.search(r"^\s*dockerfile: (\S+)\s*$", server, re.M)
        c.check(m is not None and os.path.realpath(m.group(1)) == os.path.realpath(root),
                f"{name}: flce-server should build with the repository root as context")
        c.check(d is not None and d.group(1) == want_df,
                f"{name}: flce-server should build {want_df}, builds "
                f"{d.group(1) if d else 'nothing'}")
        if d:
            c.check(os.path.isfile(os.path.join(root, d.group(1))),
                    f"{name}: builds {d.group(1)}, which does not exist")
        img = re.search(r"^\s*image: (\S+)\s*$", server, re.M)
        want_img = "flce:latest" if name != "docker-compose.cpu.yml" else "flce:cpu"
        c.check(img is not None and img.group(1) == want_img,
                f"{name}: flce-server's default image should be {want_img}")

        gpu = name != "docker-compose.cpu.yml"
        has_gpu = ("driver: nvidia" in server and re.search(r"capabilities:\s*\n\s*- gpu", server)
                   and re.search(r"(device_ids:|count:)", server))
        if gpu:
            c.check(bool(has_gpu), f"{name}: flce-server has no deploy.resources.reservations."
                                   "devices entry with driver nvidia, capabilities [gpu] and "
                                   "count or device_ids")
            c.check("--device=auto" in server or "--device=cuda" in server,
                    f"{name}: flce-server should run with --device auto or cuda")
        else:
            c.check(not has_gpu and "nvidia" not in server,
                    f"{name}: the CPU variant must not reserve a GPU")
            c.check("--device=cpu" in server, f"{name}: the CPU variant must pass --device=cpu")
        same_host = name == "docker-compose.same-host.yml"
        c.check(("ipc: host" in server) == same_host,
                f"{name}: ipc: host belongs to the same-host variant only")
        c.check(("target: /dev/shm" in server or ":/dev/shm" in server) == same_host,
                f"{name}: the host's /dev/shm is shared in the same-host variant only")
        socket = re.search(r"--unix-socket=(/\S+)/[^/\s]+", server)
        c.check(("--local-transports=shm" in server) == same_host
                and (socket is not None) == same_host,
                f"{name}: shared memory and the Unix socket belong to the same-host variant "
                "only")
        if socket is not None:
            directory = re.escape(socket.group(1))
            c.check(re.search(rf"(:|target: ){directory}(:rw)?\s*$", server, re.M) is not None,
                    f"{name}: the Unix socket's directory {socket.group(1)} is not a volume "
                    "that trainers on the host can reach")
        for port in ("50051", "9464"):
            c.check(re.search(rf"target: {port}\b", server) is not None,
                    f"{name}: flce-server does not publish container port {port}")
        c.check("--metrics-port=9464" in server, f"{name}: flce-server needs --metrics-port=9464")
        # The server advertises its data port itself: published under the same number.
        data = re.search(r"--data-port=(\d+)", server)
        c.check(data is not None and re.search(
                    rf"published: \"?{data.group(1)}\"?\s*\n\s*target: {data.group(1)}\b",
                    server) is not None,
                f"{name}: flce-server should run with --data-port and publish it under its "
                "own number")
        c.check(re.search(r"--head-root=(\S+)", server) is not None
                and re.search(r":/heads(:ro)?\s*$", server, re.M) is not None,
                f"{name}: flce-server needs --head-root and a volume mounted on it")
        c.check("health" in server and "flce-client" in server,
                f"{name}: flce-server's healthcheck should use flce-client health")
        for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--auth-token-file"):
            c.check(re.search(rf"^\s*#.*{flag}", src, re.M) is not None,
                    f"{name}: {flag} should be shown (commented out) in flce-server's command")
        prom = blocks.get("prometheus", "")
        c.check("prom/prometheus" in prom, f"{name}: prometheus should use prom/prometheus")
        c.check("/etc/prometheus/prometheus.yml" in prom and "prometheus/prometheus.yml" in prom,
                f"{name}: prometheus should mount deploy/prometheus/prometheus.yml")
        graf = blocks.get("grafana", "")
        c.check("grafana/grafana" in graf, f"{name}: grafana should use grafana/grafana")
        c.check("/etc/grafana/provisioning" in graf,
                f"{name}: grafana should mount the provisioning folder")
        m = re.search(r"(\S+/grafana/dashboards):(\S+?)(:ro)?\s*$", graf, re.M)
        c.check(m is not None, f"{name}: grafana should mount deploy/grafana/dashboards")
        if m:
            provider = open(os.path.join(deploy, "grafana", "provisioning", "dashboards",
                                         "flce.yml"), encoding="utf-8").read()
            c.check(f"path: {m.group(2)}" in provider,
                    f"{name}: grafana mounts the dashboards on {m.group(2)}, the provider reads "
                    "another path")
        # Every bind-mounted file or folder of the repository exists.
        for host in re.findall(r"^\s*- (/[^:\s]+):", out, re.M):
            if host.startswith(deploy) and not host.startswith(os.path.join(deploy, "heads")):
                c.check(os.path.exists(host), f"{name}: mounts {host}, which does not exist")
    return c.finish()


# ---------------------------------------------------------------- prometheus --

def check_prometheus(root, c):
    exe = shutil.which("promtool")
    if not exe:
        print("SKIP: promtool is not installed (Debian: prometheus; scripts/setup.sh installs it)")
        return fc.SKIP
    cfg = os.path.join(root, "deploy", "prometheus", "prometheus.yml")
    rc, out = run([exe, "check", "config", cfg])
    print(out.strip())
    c.check(rc == 0, "promtool check config deploy/prometheus/prometheus.yml failed")
    text = open(cfg, encoding="utf-8").read()
    c.check(re.search(r"targets:\s*\[\s*['\"]flce-server:9464['\"]", text) is not None,
            "prometheus.yml does not scrape flce-server:9464")
    rules_dir = os.path.join(root, "deploy", "prometheus", "rules")
    rules = sorted(os.path.join(rules_dir, f) for f in os.listdir(rules_dir)
                   if f.endswith((".yml", ".yaml")))
    if rules:
        rc, out = run([exe, "check", "rules"] + rules)
        print(out.strip())
        c.check(rc == 0, "promtool check rules deploy/prometheus/rules failed")
    return c.finish()


def check_alerts(root, c):
    exe = shutil.which("promtool")
    if not exe:
        print("SKIP: promtool is not installed (Debian: prometheus; scripts/setup.sh installs it)")
        return fc.SKIP
    # promtool resolves the test file's rule_files relative to the test file.
    test = os.path.join(root, "tests", "deploy", "alert_rules_test.yml")
    rc, out = run([exe, "test", "rules", test])
    print(out.strip())
    c.check(rc == 0, "promtool test rules tests/deploy/alert_rules_test.yml failed")
    return c.finish()


# ----------------------------------------------------------------- dashboard --

def check_dashboard(root, c):
    contract = fc.read_metrics_contract(root)
    allowed = fc.series_names(contract)
    try:
        dashboard = fc.load_dashboard(root)
    except (OSError, ValueError) as e:
        c.check(False, f"deploy/grafana/dashboards/flce.json does not parse: {e}")
        return c.finish()
    c.check(dashboard.get("uid") == "flce" and dashboard.get("title"),
            "the dashboard needs uid 'flce' and a title")

    queries = fc.dashboard_queries(dashboard)
    c.check(len(queries) > 10, f"the dashboard has only {len(queries)} queries")
    used = set()
    for where, expr in queries:
        names = fc.names_in_query(expr)
        c.check(bool(names), f"{where}: names no metric: {expr}")
        for n in names:
            used.add(allowed.get(n, n))
            c.check(n in allowed, f"{where}: '{n}' is not a metric of docs/METRICS.md: {expr}")
            if n.endswith("_bucket"):
                c.check("histogram_quantile" in expr and re.search(r"\ble\b", expr) is not None,
                        f"{where}: a _bucket series is read with histogram_quantile by le")
            fam = allowed.get(n)
            if fam and contract[fam]["type"] == "counter" and "label_values" not in expr:
                c.check(re.search(rf"(rate|increase|irate)\(\s*{n}\b", expr) is not None,
                        f"{where}: counter {n} should be read through rate() or increase()")
        # Labels the query groups or filters by must be labels of the metrics it reads.
        labels_used = set(re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr))
        wanted = {l.strip() for group in labels_used for l in group.split(",") if l.strip()}
        wanted |= set(re.findall(r"[{,]\s*([A-Za-z_]\w*)\s*(?:=~|!=|!~|=)", expr))
        known = {"le", "instance", "job", "service"}
        for n in names:
            fam = allowed.get(n)
            if fam:
                known |= set(contract[fam]["labels"])
        for l in sorted(wanted - known):
            c.check(False, f"{where}: label '{l}' is not a label of {names} in docs/METRICS.md")
    missing = sorted(set(contract) - used)
    c.check(not missing, f"the dashboard shows no panel for {missing}")

    # The panels docs/OPERATIONS.md describes.
    panels = [p for p in fc.dashboard_panels(dashboard) if p.get("type") != "row"]
    exprs_of = {p.get("title", ""): " ".join(t.get("expr", "") for t in p.get("targets", []))
                for p in panels}
    def has_panel(label, pattern):
        ok = any(re.search(pattern, e) for e in exprs_of.values())
        c.check(ok, f"no panel for {label} (a query matching {pattern!r})")
    has_panel("throughput", r"rate\(flce_tokens_total")
    has_panel("request latency percentiles",
              r"histogram_quantile\(0\.99,.*flce_request_duration_seconds_bucket")
    has_panel("engine time percentiles",
              r"histogram_quantile\(0\.99,.*flce_engine_duration_seconds_bucket")
    has_panel("errors by code", r'by \([^)]*code[^)]*\) \(rate\(flce_requests_total\{[^}]*code!="OK"')
    has_panel("GPU memory", r"flce_gpu_memory_used_bytes")
    has_panel("workspace", r"flce_workspace_peak_bytes")
    has_panel("heads", r"flce_heads_loaded")
    has_panel("sessions", r"flce_sessions\b")
    has_panel("bytes in", r"rate\(flce_received_bytes_total")
    has_panel("bytes out", r"rate\(flce_sent_bytes_total")
    ids = [p.get("id") for p in fc.dashboard_panels(dashboard)]
    c.check(len(ids) == len(set(ids)), "panel ids are not unique")

    # Datasource uid: the provisioned one.
    ds_file = os.path.join(root, "deploy", "grafana", "provisioning", "datasources",
                           "prometheus.yml")
    ds_text = open(ds_file, encoding="utf-8").read()
    m = re.search(r"^\s*uid:\s*(\S+)", ds_text, re.M)
    c.check(m is not None and "url: http://prometheus:9090" in ds_text,
            "the provisioned datasource needs a uid and url http://prometheus:9090")
    if m:
        uids = {json.dumps(p.get("datasource")) for p in panels if p.get("datasource")}
        for p in panels:
            for t in p.get("targets", []):
                uids.add(json.dumps(t.get("datasource")))
        for u in uids:
            c.check(m.group(1) in u, f"a panel uses datasource {u}, not uid {m.group(1)}")
    prov = open(os.path.join(root, "deploy", "grafana", "provisioning", "dashboards", "flce.yml"),
                encoding="utf-8").read()
    c.check("type: file" in prov and re.search(r"^\s*path:\s*\S+", prov, re.M) is not None,
            "the dashboard provider needs type: file and options.path")

    # Alert rules: contract metrics only (and the series Prometheus adds per target).
    for where, expr in fc.rules_expressions(root):
        for n in fc.rule_metric_names(expr):
            c.check(n in allowed, f"rule {where}: '{n}' is not a metric of docs/METRICS.md")

    # "Error" means one thing on the dashboard and in the alert: whatever leaves out OK
    # leaves out CANCELLED (the client gave up) too, as FlceErrorRateHigh does.
    error_exprs = [(f"rule {w}", e) for w, e in fc.rules_expressions(root)] + queries
    n_error = 0
    for where, expr in error_exprs:
        if "flce_requests_total" not in expr or not re.search(r'code\s*!=\s*"OK"', expr):
            continue
        n_error += 1
        c.check(re.search(r'code\s*!=\s*"CANCELLED"', expr) is not None,
                f"{where}: counts CANCELLED as an error, the other error queries do not: {expr}")
    c.check(n_error >= 3, f"found {n_error} error-rate expressions, want the alert and the "
                          "dashboard's two error panels")

    # PromQL syntax, through promtool: every query as a recording rule.
    exe = shutil.which("promtool")
    if not exe:
        print("note: promtool missing: the dashboard's PromQL syntax was not checked")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dashboard-queries.yml")
            with open(path, "w") as f:
                f.write("groups:\n  - name: dashboard\n    rules:\n")
                n = 0
                for where, expr in queries:
                    if fc.label_values_metric(expr):
                        continue
                    n += 1
                    f.write(f"      - record: flce:dashboard_query:{n}\n")
                    f.write(f"        expr: {json.dumps(fc.substitute_grafana_variables(expr))}\n")
            rc, out = run([exe, "check", "rules", path])
            c.check(rc == 0, f"a dashboard query is not valid PromQL:\n{out}")
            if rc == 0:
                print(f"ok: promtool parses the dashboard's {n} queries")
    return c.finish()


# ---------------------------------------------------------------- dockerfile --

def dockerfile_instructions(text):
    """[(INSTRUCTION, arguments)] with continuations joined and comments dropped."""
    out = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        parts = pending.strip().split(None, 1)
        out.append((parts[0].upper(), parts[1] if len(parts) > 1 else ""))
        pending = ""
    if pending.strip():
        parts = pending.strip().split(None, 1)
        out.append((parts[0].upper(), parts[1] if len(parts) > 1 else ""))
    return out


def exec_form(args):
    try:
        value = json.loads(args)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def build_packages(root):
    """deploy/docker/build-packages.txt: one package a line, `#` comments ([] if missing)."""
    path = os.path.join(root, BUILD_PACKAGES)
    if not os.path.isfile(path):
        return []
    return [w for line in open(path, encoding="utf-8") for w in line.split("#", 1)[0].split()]


def setup_packages(root):
    """scripts/setup.sh's packages: its packages=( ... ) words, where the build packages it
    reads from deploy/docker/build-packages.txt ("${build_packages[@]}") are that file's."""
    text = open(os.path.join(root, "scripts", "setup.sh"), encoding="utf-8").read()
    m = re.search(r"packages=\((.*?)\)", text, re.S)
    words = m.group(1).split() if m else []
    out = []
    for w in words:
        if "build_packages" in w:
            out += build_packages(root) if "build-packages.txt" in text else []
        elif not w.startswith("#"):
            out.append(w)
    return out


def shared_scripts(root, text):
    """The text of the deploy/docker/*.sh scripts that `text` (a stage's RUN instructions)
    runs, by file name wherever the stage copied them, comment lines left out: the steps
    the two Dockerfiles share live there."""
    out = []
    for name in sorted(set(re.findall(r"([\w.-]+\.sh)\b", text))):
        path = os.path.join(root, "deploy", "docker", name)
        if os.path.isfile(path):
            out += [l for l in open(path, encoding="utf-8").read().splitlines()
                    if not l.lstrip().startswith("#")]
    return "\n".join(out)


def stage_runs(root, stage):
    """A stage's RUN instructions, followed by the shared scripts they run."""
    runs = " ".join(a for i, a in stage["ins"] if i == "RUN")
    return runs + "\n" + shared_scripts(root, runs)


def stage_install_packages(root, stage):
    """The packages a stage installs by name: those its `apt-get install` commands name, and
    deploy/docker/build-packages.txt's when the stage copies that file in and installs
    from it."""
    runs = stage_runs(root, stage)
    pkgs = apt_install_packages(runs)
    copies = " ".join(a for i, a in stage["ins"] if i in ("COPY", "ADD"))
    if BUILD_PACKAGES in copies and "build-packages.txt" in runs and "apt-get install" in runs:
        pkgs += build_packages(root)
    return pkgs


def dockerignore_patterns(root):
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return []
    return [l.strip() for l in open(path, encoding="utf-8")
            if l.strip() and not l.strip().startswith("#")]


def ignored(patterns, rel):
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.lstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        hit = any(fnmatch.fnmatchcase(pre, pat) or
                  (pat.startswith("**/") and fnmatch.fnmatchcase(pre.split("/")[-1], pat[3:]))
                  for pre in prefixes)
        if hit:
            result = not neg
    return result


def dockerfile_stages(text):
    """[{image, name, ins}] of a Dockerfile, global ARG defaults substituted in FROM."""
    ins = dockerfile_instructions(text)
    global_args = {}
    for i, a in ins:
        if i == "FROM":
            break
        if i == "ARG":
            k, _, v = a.partition("=")
            global_args[k.strip()] = v.strip().strip('"')

    def expand(s):
        return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: global_args.get(m.group(1) or m.group(2), m.group(0)), s)

    stages = []
    for i, a in ins:
        if i == "FROM":
            words = a.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append({"image": expand(words[0]), "name": name, "ins": []})
        elif stages:
            stages[-1]["ins"].append((i, a))
    return stages


def apt_install_packages(run_args):
    """The package names of every `apt-get install` in a RUN instruction's text (options
    and shell words after the command left out)."""
    pkgs = []
    for m in re.finditer(r"apt-get\s+install\b(.*?)(?=&&|\|\||;|$)", run_args, re.M):
        for w in m.group(1).split():
            if not w.startswith("-") and not re.search(r"[$()'\"`/\\|<>]", w):
                pkgs.append(w)
    return pkgs


def check_dockerfile(root, c):
    c.check(bool(build_packages(root)), f"{BUILD_PACKAGES} is missing or lists no package")
    for rel in SHARED_STEPS + ("deploy/docker/runtime-packages.sh",):
        path = os.path.join(root, rel)
        c.check(os.path.isfile(path) and os.access(path, os.X_OK),
                f"{rel} is missing or not executable")
    text = open(os.path.join(root, "scripts", "setup.sh"), encoding="utf-8").read()
    c.check("build-packages.txt" in text,
            f"scripts/setup.sh should install {BUILD_PACKAGES} (the images' build packages)")
    gpu = check_one_dockerfile(root, c, GPU_DOCKERFILE, gpu=True)
    cpu = check_one_dockerfile(root, c, CPU_DOCKERFILE, gpu=False)
    if gpu and cpu:
        # The two build stages install the same build packages (Ubuntu 24.04 and Debian 12
        # share the names), so that a package added to one is not forgotten in the other.
        lists = [sorted(set(stage_install_packages(root, st))) for st in (gpu, cpu)]
        c.check(lists[0] == lists[1],
                f"the build stages of {GPU_DOCKERFILE} and {CPU_DOCKERFILE} install different "
                f"packages: only GPU {sorted(set(lists[0]) - set(lists[1]))}, only CPU "
                f"{sorted(set(lists[1]) - set(lists[0]))}")

    # .dockerignore keeps build trees out and sources in.
    pats = dockerignore_patterns(root)
    c.check(bool(pats), ".dockerignore is missing or empty")
    for rel in ("build", "build-main/CMakeCache.txt", ".git/HEAD"):
        c.check(ignored(pats, rel), f".dockerignore lets {rel} into the build context")
    for rel in ("CMakeLists.txt", "proto/flce/v1/flce.proto", "kernels/engine.h",
                "server/CMakeLists.txt", "client/CMakeLists.txt", "scripts/build.sh",
                "deploy/docker/runtime-packages.sh", "bench/CMakeLists.txt",
                "tests/CMakeLists.txt"):
        c.check(not ignored(pats, rel), f".dockerignore keeps {rel} out of the build context")
    return c.finish()


def check_one_dockerfile(root, c, rel, gpu):
    """Checks one image's Dockerfile; returns its build stage (None when it cannot)."""
    path = os.path.join(root, rel)
    if not c.check(os.path.isfile(path), f"{rel} is missing"):
        return None
    ins = dockerfile_instructions(open(path, encoding="utf-8").read())
    known = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
             "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
    for i, a in ins:
        c.check(i in known, f"{rel}: unknown instruction {i} {a[:40]}")
    c.check(ins and ins[0][0] in ("FROM", "ARG"), f"{rel} must start with ARG or FROM")

    stages = dockerfile_stages(open(path, encoding="utf-8").read())
    c.check(len(stages) >= 2, f"{rel}: want a multi-stage build, found {len(stages)} stage(s)")
    if len(stages) < 2:
        return None
    build, final = stages[0], stages[-1]
    if gpu:
        c.check(re.match(r"^nvidia/cuda:[\w.]+-devel-ubuntu24\.04$", build["image"]) is not None,
                f"{rel}: the build stage should be an nvidia/cuda devel image on Ubuntu 24.04, "
                f"is {build['image']}")
        c.check(re.match(r"^nvidia/cuda:[\w.]+-runtime-ubuntu24\.04$", final["image"])
                is not None,
                f"{rel}: the runtime stage should be an nvidia/cuda runtime image on Ubuntu "
                f"24.04, is {final['image']}")
        c.check(build["image"].replace("-devel-", "-X-") ==
                final["image"].replace("-runtime-", "-X-"),
                f"{rel}: build ({build['image']}) and runtime ({final['image']}) images differ "
                "in CUDA or Ubuntu version")
    else:
        c.check(build["image"] in ("debian:12", "debian:bookworm"),
                f"{rel}: the build stage should be debian:12, is {build['image']}")
        c.check(final["image"] == build["image"] + "-slim",
                f"{rel}: the runtime stage should be {build['image']}-slim, is {final['image']}")
    c.check(bool(build["name"]), f"{rel}: the build stage needs a name (FROM ... AS build)")

    # The Dockerfile's own RUN text (the CMake switches it passes) and, with the shared
    # scripts it runs, the whole build stage's (scripts/build.sh, the install, the list).
    own_runs = " ".join(a for i, a in build["ins"] if i == "RUN")
    build_runs = stage_runs(root, build)
    c.check("deploy/docker/build-stage.sh" in own_runs,
            f"{rel}: the build stage should run deploy/docker/build-stage.sh (the build step "
            "both images share)")
    copied = " ".join(a for i, a in build["ins"] if i in ("COPY", "ADD"))
    c.check(BUILD_PACKAGES in copied and "build-packages.txt" in own_runs,
            f"{rel}: the build stage should install the packages of {BUILD_PACKAGES}")
    c.check("scripts/build.sh" in build_runs,
            f"{rel}: the build stage should build with scripts/build.sh")
    c.check("-DFLCE_BUILD_TESTS=OFF" in own_runs, f"{rel}: the image build should skip the tests")
    installed = set(stage_install_packages(root, build))
    for p in setup_packages(root):
        needed = (p.endswith("-dev") or p in ("cmake", "ninja-build", "pkg-config",
                                             "protobuf-compiler", "protobuf-compiler-grpc",
                                             "build-essential"))
        if p in ("libgtest-dev", "libgmock-dev", "libbenchmark-dev", "libclang-rt-14-dev"):
            needed = False  # tests, benchmarks and the fuzzer are not built in the image
        if needed:
            c.check(p in installed,
                    f"{rel}: the build stage does not install {p} (scripts/setup.sh does)")
    if gpu:
        c.check("-DFLCE_BUILD_CUDA=ON" in own_runs and "-DFLCE_BUILD_CUDA=OFF" not in own_runs,
                f"{rel}: the GPU image should build the CUDA plugin (-DFLCE_BUILD_CUDA=ON)")
        c.check("libflce_cuda.so" in build_runs,
                f"{rel}: the build stage should pick up libflce_cuda.so")
    else:
        # CMakeLists.txt looks for nvcc only when FLCE_BUILD_CUDA is on.
        c.check("-DFLCE_BUILD_CUDA=OFF" in own_runs and "-DFLCE_BUILD_CUDA=ON" not in own_runs,
                f"{rel}: the CPU image must configure with -DFLCE_BUILD_CUDA=OFF")
        c.check(not any(re.search(r"cuda|nvidia", p) for p in installed),
                f"{rel}: the CPU image installs CUDA packages: {sorted(installed)}")
    for ref in ("scripts/build.sh", "deploy/docker/runtime-packages.sh") + SHARED_STEPS:
        if ref in build_runs:
            c.check(os.path.isfile(os.path.join(root, ref)), f"{rel} runs {ref}, missing")
    c.check("deploy/docker/runtime-packages.sh" in build_runs,
            f"{rel}: the build stage should list the runtime packages with "
            "deploy/docker/runtime-packages.sh")

    final_ins = final["ins"]
    final_runs = stage_runs(root, final)
    c.check("runtime-stage.sh" in " ".join(a for i, a in final_ins if i == "RUN"),
            f"{rel}: the runtime stage should run deploy/docker/runtime-stage.sh (the runtime "
            "step both images share)")
    for bad in ("build-essential", "cmake", "ninja-build", "-dev ", "nvcc"):
        c.check(bad not in final_runs + " ", f"{rel}: the runtime stage installs build tools ({bad})")
    c.check("runtime-packages.txt" in final_runs,
            f"{rel}: the runtime stage should install the listed runtime packages")
    copies = [a for i, a in final_ins if i == "COPY" and f"--from={build['name']}" in a]
    c.check(bool(copies), f"{rel}: the runtime stage copies nothing from the build stage")
    m = re.search(r"install -m 0755 \S*flce-server \S*flce-client (\S+?)/?\s", build_runs)
    c.check(m is not None, f"{rel}: the build stage should install flce-server and flce-client")
    if gpu:
        # flce-server and the plugin land in one folder of the runtime image.
        p = re.search(r"install -m 0644 \S+ (\S+)/libflce_cuda\.so", build_runs)
        c.check(m is not None and p is not None and m.group(1) == p.group(1),
                f"{rel}: flce-server, flce-client and libflce_cuda.so should be installed side "
                "by side")
    if m:
        c.check(any(m.group(1) in a for a in copies),
                f"{rel}: the runtime stage does not copy {m.group(1)} from the build stage")

    users = [a.strip() for i, a in final_ins if i == "USER"]
    c.check(bool(users), f"{rel}: the runtime stage has no USER: it would run as root")
    if users:
        u = users[-1].split(":")[0]
        c.check(u not in ("root", "0"), f"{rel}: the runtime stage runs as {users[-1]}")
        order = [i for i, _ in final_ins]
        c.check(order.index("USER") < order.index("ENTRYPOINT") if "ENTRYPOINT" in order else False,
                f"{rel}: USER must come before ENTRYPOINT")
    exposed = set(" ".join(a for i, a in final_ins if i == "EXPOSE").split())
    c.check({"50051", "50052", "9464"} <= exposed,
            f"{rel}: EXPOSE {sorted(exposed)}, want 50051, 50052 (the data plane) and 9464")

    hc = [a for i, a in final_ins if i == "HEALTHCHECK"]
    c.check(len(hc) == 1, f"{rel}: want one HEALTHCHECK in the runtime stage, found {len(hc)}")
    if hc:
        cmd = hc[0].split("CMD", 1)
        c.check(len(cmd) == 2, f"{rel}: HEALTHCHECK needs CMD")
        if len(cmd) == 2:
            argv = exec_form(cmd[1].strip()) or shlex.split(cmd[1])
            c.check(argv and argv[0].endswith("flce-client"),
                    f"{rel}: HEALTHCHECK should run flce-client, runs {argv[:1]}")
            c.check(argv and argv[-1] == "health",
                    f"{rel}: HEALTHCHECK should run `flce-client ... health`")
            c.check("--target" in argv and any(a.endswith(":50051") for a in argv),
                    f"{rel}: HEALTHCHECK should target the container's port 50051")
    ep = [a for i, a in final_ins if i == "ENTRYPOINT"]
    c.check(len(ep) == 1 and exec_form(ep[0]) is not None,
            f"{rel}: want one exec-form ENTRYPOINT in the runtime stage")
    if ep and exec_form(ep[0]):
        c.check(exec_form(ep[0])[0].endswith("flce-server"),
                f"{rel}: ENTRYPOINT should be flce-server")
    cmd = [a for i, a in final_ins if i == "CMD"]
    argv = (exec_form(cmd[-1]) or []) if cmd else []
    argv += exec_form(ep[0]) or [] if ep else []
    joined = " ".join(argv)
    device = "auto" if gpu else "cpu"
    c.check(re.search(rf"--device[= ]{device}\b", joined) is not None,
            f"{rel}: the default arguments should include --device {device}")
    c.check(re.search(r"--metrics-port[= ]9464", joined) is not None,
            f"{rel}: the default arguments should include --metrics-port 9464")
    print(f"ok: {rel} parsed ({len(stages)} stages: {', '.join(st['image'] for st in stages)})")
    return build


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("group", choices=["compose", "prometheus", "dashboard", "dockerfile",
                                      "alerts"])
    args = ap.parse_args()
    c = fc.Checks(f"deploy {args.group}")
    fn = {"compose": check_compose, "prometheus": check_prometheus,
          "dashboard": check_dashboard, "dockerfile": check_dockerfile,
          "alerts": check_alerts}[args.group]
    try:
        return fn(os.path.abspath(args.root), c)
    except fc.CheckFailed as e:
        print(f"FAIL: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
