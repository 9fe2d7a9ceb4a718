"""deploy/ checked against the code, as far as a machine without Docker or a cluster can.

What is checked: every file parses; the dashboard asks only for metric
names the code exposes; the probes, the scrape annotations and the compose
health checks use the endpoint's port and paths; the grace periods cover
the worker's drain; the commands exist in the CLI; the image runs as a
non-root user from a wheel. What is not: that the image builds and that
the manifests apply (no Docker daemon, no cluster here).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from consumers import Settings, load_app
from consumers.cli import _parser
from consumers.telemetry.endpoint import LIVENESS_PATH, METRICS_PATH, READINESS_PATH
from consumers.telemetry.metrics import PREFIX, DedupeCollector, Metrics
from consumers.telemetry.multiproc import SupervisorCollector
from dedupe import TableStats

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _k8s() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in _documents(path):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def _exposed_names() -> set[str]:
    """Every sample name the worker and the supervisor can expose."""
    registry = CollectorRegistry()
    Metrics(registry)
    registry.register(DedupeCollector(lambda: TableStats(rows=1.0, oldest_age_seconds=1.0)))
    registry.register(SupervisorCollector(restarts=lambda: 0, running=lambda: 0))
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_count", "_sum"),
        "gauge": ("",),
    }
    return {family.name + s for family in registry.collect() for s in suffixes[family.type]}


def _exprs(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if "definition" in variable:
            yield variable["definition"]


def test_every_deploy_file_parses() -> None:
    assert _documents(DEPLOY / "compose.yaml")
    assert len(_k8s()) >= 6
    json.loads((DEPLOY / "grafana" / "idempotent-workers.json").read_text())


def test_the_dashboard_asks_only_for_metrics_the_code_exposes() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "idempotent-workers.json").read_text())
    used = {name for expr in _exprs(dashboard) for name in re.findall(PREFIX + r"\w+", expr)}
    exposed = _exposed_names()
    assert len(used) >= 12
    assert used - exposed == set()
    # The figures no other framework has are on it.
    assert any('outcome="duplicate_ignored"' in e for e in _exprs(dashboard))
    assert any('outcome="message_id_reused"' in e for e in _exprs(dashboard))


def test_kubernetes_probes_and_scrape_use_the_endpoint_port_and_paths() -> None:
    k8s = _k8s()
    config = Settings.from_env(k8s["ConfigMap/idempotent-workers"]["data"])
    port = config.metrics.port
    assert port is not None
    deployment = k8s["Deployment/idempotent-workers"]
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": LIVENESS_PATH, "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": READINESS_PATH, "port": "metrics"}
    assert ports["metrics"] == port
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == METRICS_PATH
    service = k8s["Service/idempotent-workers-metrics"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_deploy_opens_the_metrics_port_to_every_address_wherever_it_serves_it() -> None:
    """The endpoint listens on 127.0.0.1 unless told: probes and scrapes come from outside."""
    k8s = Settings.from_env(_k8s()["ConfigMap/idempotent-workers"]["data"]).metrics
    [compose] = _documents(DEPLOY / "compose.yaml")
    composed = Settings.from_env(compose["x-app"]["environment"]).metrics
    image_env = dict(
        re.findall(r"(IW_METRICS_\w+)=([^\s\\]+)", (DEPLOY / "Dockerfile").read_text())
    )
    image = Settings.from_env(image_env).metrics
    assert Settings.from_env({}).metrics.host == "127.0.0.1"
    for metrics in (k8s, composed, image):
        assert metrics.port is not None and metrics.host == "0.0.0.0", metrics


def test_kubernetes_grace_covers_the_prestop_and_the_drain() -> None:
    k8s = _k8s()
    config = Settings.from_env(k8s["ConfigMap/idempotent-workers"]["data"])
    spec = k8s["Deployment/idempotent-workers"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    needed = float(pre_stop[1]) + config.worker.shutdown_grace_seconds
    assert spec["terminationGracePeriodSeconds"] > needed
    assert (
        container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    )
    assert container["args"][0] == "run"


def test_the_disruption_budget_and_the_migration_job_fit_the_deployment() -> None:
    k8s = _k8s()
    deployment = k8s["Deployment/idempotent-workers"]
    budget = k8s["PodDisruptionBudget/idempotent-workers"]
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]
    job = k8s["Job/idempotent-workers-migrate"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]


def _cli_commands() -> set[str]:
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("the CLI has no subcommands")


def test_compose_workers_are_probed_on_the_endpoint_and_drain_in_time() -> None:
    [compose] = _documents(DEPLOY / "compose.yaml")
    base = compose["x-app"]
    port = Settings.from_env(base["environment"]).metrics.port
    grace = Settings.from_env(base["environment"]).worker.shutdown_grace_seconds
    assert float(base["stop_grace_period"].rstrip("s")) > grace
    workers = [s for name, s in compose["services"].items() if name.startswith("worker")]
    assert len(workers) == 2
    for worker in workers:
        assert worker["command"][0] == "run"
        check = " ".join(worker["healthcheck"]["test"])
        assert f"127.0.0.1:{port}{READINESS_PATH}" in check
        assert any(p.endswith(f":{port}") for p in worker["ports"])
    for name in ("rabbitmq", "postgres"):
        assert compose["services"][name]["healthcheck"]["test"]


def test_the_commands_the_deploy_files_run_exist() -> None:
    [compose] = _documents(DEPLOY / "compose.yaml")
    used = {s["command"][0] for s in compose["services"].values() if "command" in s}
    used |= {
        c["args"][0]
        for doc in _k8s().values()
        if doc["kind"] in ("Deployment", "Job")
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert {"migrate", "run", "relay", "serve"} <= used
    assert used - _cli_commands() == set()


def test_the_image_runs_the_wheel_as_a_non_root_user() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any("pip install" in line and ".whl" in line for line in final)
    assert 'ENTRYPOINT ["idempotent-workers"]' in final
    env_port = re.search(r"IW_METRICS_PORT=(\d+)", "\n".join(final))
    assert env_port is not None
    assert f"EXPOSE {env_port.group(1)}" in final
    assert any(LIVENESS_PATH in line for line in final)
    copied = set()
    for line in lines:  # what it copies from the repository is there
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (DEPLOY.parent / source).exists(), source
                copied.add(source)
    # ...and it is every package the wheel is built from.
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, packages - copied
    # ...with the extras the compose services need (push providers, the send API).
    extras = re.search(r"\.whl\)\[([a-z,]+)\]", "\n".join(final))
    assert extras is not None
    assert {"push", "serve"} <= set(extras.group(1).split(","))
    assert {"push", "serve"} <= set(project["project"]["optional-dependencies"])


def test_the_example_app_the_image_runs_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DEPLOY / "example"))
    try:
        app = load_app("shipments:app")
    finally:
        sys.modules.pop("shipments", None)
    assert "orders.shipped" in app.specs
