"""The house's rules that a reader relies on: the framework alone in `consumers`, no circles."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def test_consumers_holds_the_framework_alone() -> None:
    names = {p.name for p in (ROOT / "consumers").iterdir()}
    assert names.isdisjoint({"bench", "chaos", "demo"})
    assert not (ROOT / "providers" / "bench.py").exists()


def test_no_import_circle_inside_the_framework() -> None:
    for package in ("console", "consumers", "dedupe", "ingress", "providers"):
        graph = grimp.build_graph(package)
        circles = [
            (module, imported)
            for module in sorted(graph.modules)
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith(package)
            and graph.chain_exists(importer=imported, imported=module)
        ]
        assert circles == [], f"{package}: modules that import each other: {circles}"
