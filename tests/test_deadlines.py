"""proving.deadlines: a wait past its deadline raises naming it, with the stacks and the state."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import aio_pika
import pytest

from proving.deadlines import DeadlineExceeded, deadline, within
from tests.support import run_to_end


class SilentBroker:
    """A TCP listener that takes connections and never says a word (a hung node)."""

    def __init__(self) -> None:
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> SilentBroker:
        self._server = await asyncio.start_server(self._take, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"amqp://guest:guest@127.0.0.1:{port}/"

    async def _take(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)

    async def state(self) -> list[str]:
        return [f"silent broker: {self.accepted} connection(s) taken, not a byte sent"]


async def test_a_connect_to_a_broker_that_never_answers_fails_naming_the_wait(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with SilentBroker() as broker:
        with pytest.raises(DeadlineExceeded, match=r"a connection to the silent broker.*1\.0 s"):
            # aio-pika's own connect has no timeout unless given one: it would wait forever.
            await within(
                1.0,
                "a connection to the silent broker",
                aio_pika.connect(broker.url),
                state=[broker],
            )
    report = capsys.readouterr().err
    assert "deadline: a connection to the silent broker: nothing after 1.0 s" in report
    # The stacks are taken before the cancel: the await chain ends inside the connect.
    assert "aiormq/connection.py" in report, report
    assert "silent broker: 1 connection(s) taken, not a byte sent" in report


async def test_a_timeout_of_the_body_s_own_passes_through_unchanged() -> None:
    with pytest.raises(TimeoutError) as raised:
        async with deadline(30, "a body with a bound of its own"):
            await asyncio.wait_for(asyncio.Event().wait(), 0.05)
    assert not isinstance(raised.value, DeadlineExceeded)


async def test_a_state_that_does_not_answer_is_reported_not_waited_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Hung:
        async def state(self) -> list[str]:
            await asyncio.Event().wait()  # never set: a node that does not answer
            return []

    monkeypatch.setattr("proving.deadlines.STATE_DEADLINE_S", 0.2)
    with pytest.raises(DeadlineExceeded):
        await within(0.1, "a wait on nothing", asyncio.Event().wait(), state=[Hung()])
    assert "no state within" in capsys.readouterr().err


def test_a_child_past_its_timeout_is_sigtermed_and_its_last_words_shown() -> None:
    # A child that, like the chaos command, answers SIGTERM by saying where it waits.
    child = (
        "import signal, sys, threading\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('waiting on the broker', file=sys.stderr),"
        " sys.exit(1)))\n"
        "print('started', flush=True)\n"
        "threading.Event().wait()\n"
    )
    with pytest.raises(AssertionError, match=r"(?s)did not end within 1 s.*waiting on the broker"):
        run_to_end([sys.executable, "-c", child], timeout=1.0, grace=30.0)
