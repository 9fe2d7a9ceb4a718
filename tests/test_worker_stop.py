"""A close step that fails during stop() is logged and the other steps still run."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from consumers.runtime.worker import _close_logged


async def test_a_failing_close_is_logged_not_raised() -> None:
    async def broken() -> None:
        raise ConnectionResetError("peer went away")

    with capture_logs() as logs:
        await _close_logged("amqp_connection", broken)
    assert [(e["event"], e["what"]) for e in logs] == [("close_failed", "amqp_connection")]


async def test_a_cancelled_error_handed_on_by_a_library_is_logged_not_raised() -> None:
    async def hands_on_cancelled() -> None:
        closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.set_exception(asyncio.CancelledError())
        await closing

    with capture_logs() as logs:
        await _close_logged("database_pool", hands_on_cancelled)
    assert [e["event"] for e in logs] == ["close_failed"]


async def test_a_real_cancellation_of_the_stopping_task_still_cancels_it() -> None:
    entered = asyncio.Event()

    async def slow() -> None:
        entered.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(_close_logged("database_pool", slow))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
