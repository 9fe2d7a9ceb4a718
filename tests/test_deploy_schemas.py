"""`make deploy-check` can fail, and checks the Kubernetes versions deploy/README.md claims.

`make deploy-check` validates deploy/ against the real schemas (Kubernetes'
OpenAPI schemas through kubernetes-validate, the Compose specification through
check-jsonschema). A check that passes everything would look the same as one
that works, so here each tool is given a manifest with one unknown field and
must refuse it, naming the field; and the versions the Makefile checks are the
ones the README names.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def _checked_versions() -> list[str]:
    line = re.search(r"^K8S_VERSIONS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert line is not None, "the Makefile names no K8S_VERSIONS"
    return line.group(1).split()


def _with_unknown_field(source: Path, after: str, field: str, target: Path) -> Path:
    text = source.read_text()
    assert after in text, f"{source.name} no longer has {after!r}"
    indent = after[: len(after) - len(after.lstrip())]
    target.write_text(text.replace(after, f"{after}\n{indent}{field}: 1", 1))
    return target


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_readme_names_every_kubernetes_version_the_makefile_checks() -> None:
    readme = (DEPLOY / "README.md").read_text()
    versions = _checked_versions()
    assert versions, "deploy-check checks no Kubernetes version"
    for version in versions:
        minor = version.rsplit(".", 1)[0] if version.count(".") == 2 else version
        assert minor in readme, f"deploy/README.md does not name Kubernetes {minor}"


def test_kubernetes_validate_refuses_a_manifest_with_an_unknown_field(tmp_path: Path) -> None:
    manifest = _with_unknown_field(
        DEPLOY / "k8s" / "worker.yaml", "  replicas: 2", "replicaz", tmp_path / "worker.yaml"
    )
    for version in (_checked_versions()[0], _checked_versions()[-1]):
        done = _run(BIN / "kubernetes-validate", "--strict", "-k", version, manifest)
        assert done.returncode != 0, f"{version}: passed {done.stdout}"
        assert "replicaz" in done.stdout + done.stderr


def test_the_compose_schema_refuses_a_service_with_an_unknown_field(tmp_path: Path) -> None:
    compose = DEPLOY / "compose.yaml"
    broken = _with_unknown_field(compose, '    restart: "no"', "restartt", tmp_path / "c.yaml")
    schema = ("--builtin-schema", "vendor.compose-spec")
    assert _run(BIN / "check-jsonschema", *schema, compose).returncode == 0
    done = _run(BIN / "check-jsonschema", *schema, broken)
    assert done.returncode != 0, done.stdout
    assert "restartt" in done.stdout + done.stderr
