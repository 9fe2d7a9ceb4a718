"""A worker whose start fails on a service says so with its own exit status.

Chaos counted one rolling SIGTERM as "not exiting 0" (issue 8, case 6): its
log showed the process had not failed to stop; its start had failed, an AMQP
connection cut while it set up its second queue, with the SIGTERM crossing it.
A start that fails on a service now exits EXIT_START_FAILED with a
`start_failed` line, which the chaos fleet counts as a start failure.
"""

from __future__ import annotations

import socket

from consumers.telemetry.failed_start import EXIT_START_FAILED
from tests.conftest import Spawn


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_start_that_fails_on_a_service_exits_start_failed_not_a_traceback(
    spawn: Spawn,
) -> None:
    down = f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"
    worker = spawn({"DATABASE_URL": down})
    await worker.expect_exit(EXIT_START_FAILED, timeout=60)
    said = worker.log_text()
    assert '"event":"start_failed"' in said.replace(" ", "")
    assert "ConnectionRefusedError" in said
