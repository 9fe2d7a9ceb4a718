"""Find a user's App from `MODULE:APP`, searching their folder first, as uvicorn does.

`load_app("shipments:app", app_dir=".")` puts the folder (made absolute) first
on `sys.path` and imports `shipments` from there, so `idempotent-workers run
shipments:app` works from the folder that holds shipments.py, whatever bin/
the console script lives in. It is done once per folder, and only by the
commands that load an app (`run`, `cleanup --app`).

A target that gives no App raises `AppNotLoaded`, naming what was tried:

ConfigurationError
  AppNotLoaded            `problem` says which step failed:
    bad_target            not MODULE:APP
    module_not_found      no module of that name in app_dir nor on sys.path
    module_import_failed  the module exists but raised while imported (the user's
                          own bug, an ImportError of theirs included): `detail`
                          is the traceback's last line, `where` its innermost frame
    attribute_not_found   the module has no such attribute
    not_an_app            the attribute is not an `App`
"""

from __future__ import annotations

import importlib
import sys
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Any

from consumers.handlers.app import App
from consumers.message.decisions import ConfigurationError


class AppProblem(StrEnum):
    BAD_TARGET = "bad_target"
    MODULE_NOT_FOUND = "module_not_found"
    MODULE_IMPORT_FAILED = "module_import_failed"
    ATTRIBUTE_NOT_FOUND = "attribute_not_found"
    NOT_AN_APP = "not_an_app"


class AppNotLoaded(ConfigurationError):
    """`target` gave no App: `problem`, in `app_dir`, because of `detail` (at `where`)."""

    def __init__(
        self, problem: AppProblem, *, target: str, app_dir: str, detail: str, where: str = ""
    ) -> None:
        super().__init__(f"{target}: {problem} in {app_dir}: {detail}")
        self.problem = problem
        self.target = target
        self.module, _, self.attribute = target.partition(":")
        self.app_dir = app_dir
        self.detail = detail
        self.where = where


def load_app(target: str, *, app_dir: str | Path | None = None) -> App:
    """Import `module:attribute` and return the App found there.

    `app_dir`: a folder searched before the rest of `sys.path` (the CLI's
    `--app-dir`, "." by default); None leaves `sys.path` as it is.
    Raises `AppNotLoaded` saying what was tried and why it gave no App.
    """
    searched = str(Path(app_dir).resolve()) if app_dir is not None else "sys.path"
    if app_dir is not None and searched not in sys.path:
        sys.path.insert(0, searched)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise AppNotLoaded(
            AppProblem.BAD_TARGET,
            target=target,
            app_dir=searched,
            detail=f"expected MODULE:APP (shipments:app), got {target!r}",
        )
    module = _imported(module_name, target, searched)
    app: Any = getattr(module, attribute, None)
    if app is None and not hasattr(module, attribute):
        raise AppNotLoaded(
            AppProblem.ATTRIBUTE_NOT_FOUND,
            target=target,
            app_dir=searched,
            detail=f"module {module_name!r} ({module.__file__}) has no attribute {attribute!r}",
        )
    if not isinstance(app, App):
        raise AppNotLoaded(
            AppProblem.NOT_AN_APP,
            target=target,
            app_dir=searched,
            detail=f"{target} is a {type(app).__name__}, not an idempotent-workers App",
        )
    return app


def _imported(module_name: str, target: str, searched: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _names_target(exc.name, module_name):
            raise AppNotLoaded(
                AppProblem.MODULE_NOT_FOUND,
                target=target,
                app_dir=searched,
                detail=f"{exc.msg} (searched {searched} first, then sys.path)",
            ) from exc
        raise _import_failed(exc, target, searched) from exc
    except Exception as exc:  # the user's module raised while imported: their bug, said as such
        raise _import_failed(exc, target, searched) from exc


def _names_target(missing: str, module_name: str) -> bool:
    """Whether the module not found is the target or a package on its path (`pkg` of `pkg.m`)."""
    return module_name == missing or module_name.startswith(f"{missing}.")


def _import_failed(exc: Exception, target: str, searched: str) -> AppNotLoaded:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if not f.filename.startswith("<frozen ")]
    where = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else ""
    return AppNotLoaded(
        AppProblem.MODULE_IMPORT_FAILED,
        target=target,
        app_dir=searched,
        detail=traceback.format_exception_only(exc)[-1].strip(),
        where=where,
    )
