"""`idempotent-workers run MODULE:APP` finds the app where a user keeps it.

Run as a user runs it: the installed console script, from a folder of the
user's own holding `shipments.py`, with nothing on PYTHONPATH. The working
directory (or `--app-dir DIR`) is searched first, as uvicorn does; a target
that gives no App is one `start_failed` line naming what was tried, and exit
78 (EX_CONFIG), with one process or under a supervisor, before any child.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from consumers.telemetry.failed_start import EXIT_CONFIG
from dedupe import DbConnection
from tests.support import ROOT, wait_for

SCRIPT = ROOT / ".venv" / "bin" / "idempotent-workers"
START_S = 60.0
STOP_S = 60.0

SHIPMENTS = """\
from consumers import App, Context

app = App()
NOT_AN_APP = 42

@app.handler({queue!r})
async def record_shipment(ctx: Context) -> None:
    await ctx.tx.execute("SELECT $1::bigint", ctx.body["order_id"])
"""
# The user's own bug: an import inside their module that fails.
BROKEN = "import library_nobody_installed  # noqa\nfrom consumers import App\napp = App()\n"


@pytest.fixture
def app_dir(tmp_path: Path, queue_name: str) -> Path:
    """A user's folder: shipments.py (the README's app, on the test's queue) and broken.py."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "shipments.py").write_text(SHIPMENTS.format(queue=queue_name))
    (folder / "broken.py").write_text(BROKEN)
    return folder


@pytest.fixture
def user_env(worker_env: dict[str, str]) -> dict[str, str]:
    """The user's environment: the services, and no PYTHONPATH of ours."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **worker_env}


def _cli(args: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_S,
        check=False,
    )


def _events(text: str, name: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def _read(log: Path) -> str:
    return log.read_text(errors="replace")


async def _runs_until_sigterm(
    args: list[str], *, cwd: Path, env: dict[str, str], log: Path, workers: int = 1
) -> None:
    """Start `run ...`, wait for `workers` worker_started lines, SIGTERM, expect exit 0."""
    with log.open("wb") as out:
        proc = subprocess.Popen([str(SCRIPT), *args], cwd=cwd, env=env, stdout=out, stderr=out)
    try:

        async def started() -> bool:
            text = _read(log)
            assert proc.poll() is None, f"exited {proc.returncode}:\n{text}"
            return len(_events(text, "worker_started")) >= workers

        await wait_for(started, timeout=START_S)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, STOP_S)
        assert code == 0, _read(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_run_imports_the_app_from_the_working_directory(
    app_dir: Path, user_env: dict[str, str], db: DbConnection, tmp_path: Path
) -> None:
    await _runs_until_sigterm(
        ["run", "shipments:app"], cwd=app_dir, env=user_env, log=tmp_path / "run.log"
    )


async def test_run_imports_the_app_from_app_dir(
    app_dir: Path, user_env: dict[str, str], db: DbConnection, tmp_path: Path
) -> None:
    await _runs_until_sigterm(
        ["run", "shipments:app", "--app-dir", str(app_dir)],
        cwd=tmp_path,
        env=user_env,
        log=tmp_path / "run.log",
    )


async def test_every_child_of_a_supervisor_imports_from_app_dir(
    app_dir: Path, user_env: dict[str, str], db: DbConnection, tmp_path: Path
) -> None:
    await _runs_until_sigterm(
        ["run", "shipments:app", "--processes", "2", "--app-dir", str(app_dir)],
        cwd=tmp_path,
        env=user_env,
        log=tmp_path / "run.log",
        workers=2,
    )


def test_cleanup_checks_an_app_from_the_working_directory(
    app_dir: Path, user_env: dict[str, str], db: DbConnection
) -> None:
    done = _cli(["cleanup", "--app", "shipments:app"], cwd=app_dir, env=user_env)
    assert done.returncode == 0, done.stderr
    assert "cleanup: schema=" in done.stdout


# (target, the error, what `detail` must name)
WRONG_TARGETS = [
    ("shipments:nope", "attribute_not_found", "nope"),
    ("no_such_module_here:app", "module_not_found", "no_such_module_here"),
    ("shipments:NOT_AN_APP", "not_an_app", "int"),
    ("shipments", "bad_target", "MODULE:APP"),
    ("broken:app", "module_import_failed", "library_nobody_installed"),
]


@pytest.mark.parametrize("processes", ["1", "2"])
@pytest.mark.parametrize(
    ("target", "error", "named"), WRONG_TARGETS, ids=[t[1] for t in WRONG_TARGETS]
)
def test_a_target_that_gives_no_app_is_one_start_failed_line_and_exit_78(
    app_dir: Path,
    user_env: dict[str, str],
    target: str,
    error: str,
    named: str,
    processes: str,
) -> None:
    done = _cli(["run", target, "--processes", processes], cwd=app_dir, env=user_env)
    said = f"exit {done.returncode}\nstderr:\n{done.stderr}\nstdout:\n{done.stdout}"
    assert done.returncode == EXIT_CONFIG, said
    assert "Traceback" not in done.stderr + done.stdout, said
    lines = _events(done.stderr, "start_failed")
    assert len(lines) == 1, said
    (line,) = lines
    module, _, attribute = target.partition(":")
    assert line["error"] == error, line
    assert line["exit_code"] == EXIT_CONFIG
    assert line["target"] == target
    assert line["module"] == module and line["attribute"] == attribute
    assert line["app_dir"] == str(app_dir.resolve())
    assert named in line["detail"], line
    assert not _events(done.stderr, "process_started"), "a child started: " + said


def test_an_import_error_inside_the_users_module_says_where(
    app_dir: Path, user_env: dict[str, str]
) -> None:
    done = _cli(["run", "broken:app"], cwd=app_dir, env=user_env)
    (line,) = _events(done.stderr, "start_failed")
    assert line["detail"] == "ModuleNotFoundError: No module named 'library_nobody_installed'"
    assert line["where"] == f"{app_dir.resolve() / 'broken.py'}:1", line
