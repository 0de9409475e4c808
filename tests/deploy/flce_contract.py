"""Shared helpers of the deployment tests: the metrics contract (docs/METRICS.md), the
metric names a PromQL expression uses, the queries of the Grafana dashboard and of the
Prometheus rules, and a parser of the Prometheus text exposition format.

Standard library only (the tests run with /usr/bin/python3).
"""

import json
import math
import os
import re

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests


class CheckFailed(Exception):
    pass


class Checks:
    """Collects failures so that one run reports all of them."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.passed = 0

    def check(self, ok, message):
        if ok:
            self.passed += 1
        else:
            self.failures.append(message)
            print(f"FAIL: {message}", flush=True)
        return ok

    def finish(self):
        print(f"{self.name}: {self.passed} checks passed, {len(self.failures)} failed", flush=True)
        return 1 if self.failures else 0


# ---------------------------------------------------------------- the contract --

# Series Prometheus itself records for every target it scrapes: rules may read them, the
# server does not export them.
PROMETHEUS_SERIES = {"up"}


def read_metrics_contract(root):
    """{metric name: type} from the tables of docs/METRICS.md (flce's own metrics and the
    standard process_* ones)."""
    path = os.path.join(root, "docs", "METRICS.md")
    metrics = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\|\s*`((?:flce|process)_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|"
                         r"\s*([^|]*)\|", line)
            if m:
                labels = [l.strip(" `") for l in m.group(3).split(",") if l.strip(" `")]
                metrics[m.group(1)] = {"type": m.group(2), "labels": labels}
    if not metrics:
        raise CheckFailed(f"{path}: no metric table found")
    return metrics


def series_names(contract):
    """Every series name the contract allows, mapped to its family name."""
    names = {}
    for name, info in contract.items():
        names[name] = name
        if info["type"] == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[name + suffix] = name
        elif info["type"] == "summary":
            for suffix in ("_sum", "_count"):
                names[name + suffix] = name
    return names


# ------------------------------------------------------------------- PromQL --

PROMQL_KEYWORDS = {
    # aggregation operators
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile",
    # modifiers and binary operators
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "atan2", "inf", "nan", "start", "end",
}

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$__range_s": "3600",
    "${__rate_interval}": "1m", "${__interval}": "15s", "${__range}": "1h",
}


def substitute_grafana_variables(expr):
    """The expression with Grafana's variables replaced by plain PromQL values."""
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    # Template variables of the dashboard, used as regex matchers.
    expr = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)
    return expr


def promql_metric_names(expr):
    """Metric names an expression selects (identifiers that are neither functions,
    keywords, label names in grouping clauses nor anything inside {...} or [...])."""
    e = substitute_grafana_variables(expr)
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)          # string literals
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\{[^{}]*\}", " ", e)                   # label matchers
    e = re.sub(r"\[[^\[\]]*\]", " ", e)                 # range selectors, subqueries
    # Label lists of grouping and matching clauses: by (a, b), on(a), group_left(c) ...
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", r"\1 ", e)
    names = []
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)", e):
        ident = m.group(1)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if ident.lower() in PROMQL_KEYWORDS:
            continue
        names.append(ident)
    return names


def rule_metric_names(expr):
    """promql_metric_names of an alert or recording rule, less PROMETHEUS_SERIES."""
    return [n for n in promql_metric_names(expr) if n not in PROMETHEUS_SERIES]


def label_values_metric(query):
    """The metric of a Grafana label_values(metric, label) query, or None."""
    m = re.match(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?\s*,", query)
    return m.group(1) if m else None


# ---------------------------------------------------------------- dashboard --

def load_dashboard(root):
    path = os.path.join(root, "deploy", "grafana", "dashboards", "flce.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def dashboard_panels(dashboard):
    """Every panel, rows' collapsed children included."""
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries(dashboard):
    """[(where, expr)] for every PromQL expression of the dashboard: panel targets and
    query variables (label_values(...) queries are returned as is)."""
    queries = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            if "expr" in target:
                queries.append((f"panel '{panel.get('title')}' target {target.get('refId')}",
                                target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            if isinstance(q, dict):
                q = q.get("query", "")
            queries.append((f"variable '{var.get('name')}'", q or ""))
    return queries


def names_in_query(expr):
    metric = label_values_metric(expr)
    if metric is not None:
        return [metric]
    return promql_metric_names(expr)


def dashboard_metric_names(dashboard):
    names = set()
    for _, expr in dashboard_queries(dashboard):
        names.update(names_in_query(expr))
    return names


def rules_expressions(root):
    """[(alert or record name, expr)] of deploy/prometheus/rules/*.yml, read as text: each
    rule's `expr:` is either one line or a `|` block."""
    folder = os.path.join(root, "deploy", "prometheus", "rules")
    out = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".yml", ".yaml")):
            continue
        lines = open(os.path.join(folder, name), encoding="utf-8").read().splitlines()
        current = name
        i = 0
        while i < len(lines):
            line = lines[i]
            m = re.match(r"^\s*-?\s*(alert|record):\s*(\S+)", line)
            if m:
                current = m.group(2)
            m = re.match(r"^(\s*)expr:\s*(.*)$", line)
            if m:
                indent, value = len(m.group(1)), m.group(2).strip()
                if value in ("|", ">", "|-", ">-"):
                    block = []
                    i += 1
                    while i < len(lines) and (not lines[i].strip() or
                                              len(lines[i]) - len(lines[i].lstrip()) > indent):
                        block.append(lines[i].strip())
                        i += 1
                    out.append((f"{name}: {current}", " ".join(block).strip()))
                    continue
                out.append((f"{name}: {current}", value.strip("'\"")))
            i += 1
    return out


# --------------------------------------------------- Prometheus text format --

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_exposition(text):
    """(types, samples): types {family: type} from # TYPE lines; samples a list of
    (name, {label: value}, float)."""
    types = {}
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise CheckFailed(f"unparseable exposition line: {line!r}")
        labels = {}
        body = m.group(3) or ""
        pos = 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                raise CheckFailed(f"unparseable labels in {line!r}")
            labels[lm.group(1)] = bytes(lm.group(2), "utf-8").decode("unicode_escape")
            pos = lm.end()
        value = m.group(4)
        v = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(value)
        samples.append((m.group(1), labels, float(value) if v is None else v))
    return types, samples


def select(samples, name, **labels):
    return [(l, v) for n, l, v in samples
            if n == name and all(l.get(k) == val for k, val in labels.items())]


def total(samples, name, **labels):
    return sum(v for _, v in select(samples, name, **labels))
