"""Each package's __all__ lists its public names, and every listed name exists."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = ["consumers", "dedupe", "ingress", "providers", "providers.fakes"]


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
