"""Each package's __all__ lists its public names, and every listed name exists."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = [
    "console",
    "consumers",
    "consumers.testing",
    "dedupe",
    "ingress",
    "providers",
    "providers.fakes",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_every_public_name_the_package_imports(name: str) -> None:
    package = importlib.import_module(name)
    exported = set(package.__all__)
    public = {  # what the package imports from its own modules
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_")
        and not inspect.ismodule(value)
        and str(getattr(value, "__module__", "")).startswith(name)
    }
    assert public - exported == set(), "public but missing from __all__"
    # getattr, not vars(): providers loads its APNs and FCM names lazily
    assert [n for n in sorted(exported) if getattr(package, n, None) is None] == []


def test_leaves_do_not_import_consumers() -> None:
    # import-linter enforces this in `make check`; this keeps it visible in tests too.
    for leaf in ("dedupe", "providers"):
        module = importlib.import_module(leaf)
        for value in vars(module).values():
            origin = getattr(value, "__module__", "") or ""
            assert not origin.startswith("consumers"), (leaf, value)


# What the applications of the framework (ingress, proving) still take from its
# inside: the topology for the chaos and demo set-ups, exit codes a supervisor
# test reads, the line and exit status of a failed start (`serve` ends as `run`
# does), the relay's entry point, the push job's limits and its split into
# parts (the send API stores a large send as the publisher would split it), a
# dead letter's header, the webhook and e-mail jobs' limits and the endpoints' rules and
# secrets' key (the send API's endpoint routes are the CLI's other face), how a
# target's address is shown, the worker's own delivery object (the bench's stopwatch
# times it as it times aio-pika's), the worker's frame reader (its bench
# times it against aiormq's), the garbage collector as `run` sets it (the
# benches measure what `run` does), the socket `serve` and `console` listen on
# before they print their port and the head and body deadlines they serve
# with, the outcome lines' buffer (its bench times it
# against the lines held as before). Everything else comes through `consumers`'
# public face.
INTERNAL_IMPORTS_ALLOWED = {
    "consumers.broker.consume",
    "consumers.broker.frames",
    "consumers.broker.topology",
    "consumers.runtime.watchdog",
    "consumers.runtime.process",
    "consumers.runtime.collector",
    "consumers.telemetry.failed_start",
    "consumers.runtime.listening",
    "consumers.runtime.http_limits",
    "consumers.jobs.push",
    "consumers.jobs.webhook",
    "consumers.jobs.email",
    "consumers.jobs.webhook_endpoints",
    "consumers.jobs.kind",
    "consumers.publishing.parts",
    "consumers.publishing.relay",
    "consumers.pipeline.settle",
    "consumers.pipeline.batch",  # the bench times a batch's phases (proving.bench.phases)
    "consumers.pipeline.held",  # and its BEGIN and COMMIT there
    "consumers.telemetry.logs",  # proving.bench.lines
}


def test_applications_reach_the_framework_through_its_public_face() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    reached: set[str] = set()
    for package in ("ingress", "proving"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "consumers."
                ):
                    reached.add(str(node.module))
    assert reached - INTERNAL_IMPORTS_ALLOWED == set(), "import it from `consumers` instead"


def test_the_inside_of_consumers_exports_nothing() -> None:
    import pkgutil

    import consumers

    for info in pkgutil.iter_modules(consumers.__path__):
        if info.ispkg and info.name != "testing":  # the test kit: a public face of its own
            package = importlib.import_module(f"consumers.{info.name}")
            assert getattr(package, "__all__", []) == [], info.name
            assert "Internal" in (package.__doc__ or ""), info.name
