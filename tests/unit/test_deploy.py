"""deploy/: the Dockerfile, the Kubernetes manifest and the Grafana dashboard agree with the
exporter (tracer.sinks.prometheus's metric names and options) and with what the tracer needs on a node.
No root, no cluster: the files are parsed and cross-checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tracer.cli import serve as servecli
from tracer.sinks import prometheus as serve
from tracer.sources import cgroups
from tracer.sources.probe import TRACEFS_DIRS

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
MANIFEST = DEPLOY / "kubernetes" / "iotrace.yaml"
DASHBOARD = DEPLOY / "grafana" / "iotrace-dashboard.json"
# labels Prometheus adds to every scraped series
TARGET_LABELS = {"instance", "job"}


def docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def daemonset_pod() -> dict:
    return docs()["DaemonSet"]["spec"]["template"]["spec"]


def container() -> dict:
    (c,) = daemonset_pod()["containers"]
    return c


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def exprs() -> list[str]:
    d = dashboard()
    out = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in d["templating"]["list"] if v.get("type") == "query"]
    return out


def listen_port(args: list[str]) -> int:
    ns = servecli.parser().parse_args(args)
    return serve.listen_address(ns.listen)[1]


# ---- the manifest ----

def test_manifest_kinds_and_selector():
    d = docs()
    assert set(d) == {"Namespace", "DaemonSet", "Service"}
    ds, svc = d["DaemonSet"], d["Service"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert ds["metadata"]["namespace"] == svc["metadata"]["namespace"] == d["Namespace"]["metadata"]["name"]


def test_daemonset_runs_serve_with_valid_options():
    args = container()["args"]
    assert args[0] == "serve"
    ns = servecli.parser().parse_args(args[1:])     # options the exporter really has
    host, _ = serve.listen_address(ns.listen)
    assert host == "0.0.0.0"                      # reachable from Prometheus, not loopback only


def test_daemonset_has_the_host_view_and_privileges():
    pod = daemonset_pod()
    assert pod["hostPID"] is True
    sc = container()["securityContext"]
    caps = set(sc.get("capabilities", {}).get("add", []))
    assert sc.get("privileged") is True or {"BPF", "PERFMON", "SYS_ADMIN"} <= caps


def test_daemonset_mounts_what_the_tracer_needs():
    pod = daemonset_pod()
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container()["volumeMounts"]}
    host_of = {path: volumes[m["name"]] for path, m in mounts.items()}
    # tracefs where tracer.sources.probe looks for it
    assert any(host_of.get(str(p)) == str(p) for p in TRACEFS_DIRS)
    # kernel headers at the host's own paths: the build link in /lib/modules points into /usr/src
    for path in ("/lib/modules", "/usr/src"):
        assert host_of.get(path) == path and mounts[path].get("readOnly") is True
    # the host's cgroup hierarchy, and the tracer told where it is
    env = {e["name"]: e.get("value") for e in container().get("env", [])}
    cg_root = env.get(cgroups.ENV_ROOT)
    assert cg_root and host_of.get(cg_root) == "/sys/fs/cgroup"


def test_ports_agree_everywhere():
    port = listen_port(container()["args"][1:])
    assert [p["containerPort"] for p in container()["ports"]] == [port]
    pod_ann = docs()["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    svc = docs()["Service"]
    for ann in (pod_ann, svc["metadata"]["annotations"]):
        assert ann["prometheus.io/scrape"] == "true"
        assert int(ann["prometheus.io/port"]) == port
        assert ann.get("prometheus.io/path", "/metrics") == "/metrics"
    (sp,) = svc["spec"]["ports"]
    assert sp["port"] == port and sp["targetPort"] in (port, container()["ports"][0]["name"])
    text = DOCKERFILE.read_text()
    assert re.search(rf"^EXPOSE\s+{port}\s*$", text, re.M)


def test_readiness_probe_asks_ready_on_the_metrics_port():
    c = container()
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == serve.READY_PATH
    assert probe["port"] in (listen_port(c["args"][1:]), c["ports"][0]["name"])


# ---- the Dockerfile ----

def _instruction(text: str, name: str) -> list[str]:
    m = re.search(rf"^{name}\s+(.+)$", text, re.M)
    assert m, name
    return json.loads(m.group(1))


def test_dockerfile_installs_bcc_and_runs_serve():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM debian:", text, re.M)
    assert "python3-bpfcc" in text and "--system-site-packages" in text
    assert re.search(r"pip install [^\n]*\[prometheus\]", text)    # the exporter's extra, which pyproject defines
    assert _instruction(text, "ENTRYPOINT") == ["iotrace"]
    cmd = _instruction(text, "CMD")
    assert cmd[0] == "serve"
    servecli.parser().parse_args(cmd[1:])
    # everything the package is built from is copied in, and not ignored; the install is not editable
    copied = {shlex.split(line)[1].rstrip("/") for line in re.findall(r"^COPY .+$", text, re.M)}
    assert {"pyproject.toml", "bpf", "tracer"} <= copied
    assert not re.search(r"pip install[^\n]* -e ", text)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert all(f"!{c}" in ignore or f"!{c}/" in ignore for c in ("pyproject.toml", "bpf", "tracer"))


def test_pyproject_has_the_prometheus_extra():
    import tomllib

    extras = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("prometheus-client") for r in extras["prometheus"])
    assert any(r.startswith("prometheus-client") for r in extras["dev"])


# ---- the dashboard ----

_NAME = re.compile(r"\b(iotrace_[a-z0-9_]+)\b")
_SELECTOR = re.compile(r"\b(iotrace_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def test_dashboard_loads_with_panels():
    d = dashboard()
    kinds = {p["type"] for p in d["panels"]}
    assert {"heatmap", "timeseries"} <= kinds
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("expr", exprs())
def test_dashboard_queries_only_exported_metrics_and_labels(expr):
    exported = serve.metric_labels()
    names = _NAME.findall(expr)
    assert names, expr
    for name in names:
        assert name in exported, f"{name} is not a metric of iotrace serve"
    for name, matchers in _SELECTOR.findall(expr):
        for label in _MATCHER.findall(matchers):
            assert label in set(exported[name]) | TARGET_LABELS, f"{name} has no label {label!r}"
    known = set().union(*(exported[n] for n in names)) | TARGET_LABELS
    for group in _BY.findall(expr):
        for label in (x.strip() for x in group.split(",") if x.strip()):
            assert label in known, f"no label {label!r} in {expr}"
    for var in re.findall(r"\$(\w+)", expr):
        assert var.startswith("__") or var in {v["name"] for v in dashboard()["templating"]["list"]}, var


def test_dashboard_has_what_the_issue_asks():
    d = dashboard()
    by_type: dict[str, list[str]] = {}
    for p in d["panels"]:
        by_type.setdefault(p["type"], []).extend(t["expr"] for t in p["targets"])
    heat = " ".join(by_type["heatmap"])
    assert f"{serve.LATENCY}_bucket" in heat and "by (le)" in heat
    assert all(t.get("format") == "heatmap" for p in d["panels"] if p["type"] == "heatmap" for t in p["targets"])
    everything = " ".join(exprs())
    for q in ("0.5", "0.99"):
        assert re.search(rf"histogram_quantile\({q}, sum by \(le, device, op\)", everything), q
    for metric in (serve.IOS, serve.BYTES, serve.DROPPED):
        assert re.search(rf"rate\({metric}\{{", everything) or re.search(rf"increase\({metric}\{{", everything)
    phases = next(v for v in d["templating"]["list"] if v["name"] == "phase")
    from tracer import contract

    assert set(phases["query"].split(",")) == set(contract.load().phases)
