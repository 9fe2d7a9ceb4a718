"""Every wait on another party has a deadline; on expiry it says what it waited for.

    async with deadline(30, "the dead-letter queues drained", state=[cluster]):
        ...                                    # any awaits, bounded together
    count = await within(10, "a passive declare of chaos.local", channel.declare_queue(...))

A broker, a database, a child process or a cluster command that stops
answering must fail the run, saying so, never hang it until a caller's
timeout kills it with nothing to show. At the deadline, before the waiting
body is cancelled (so each stack shows where it hung):

    1. print to stderr what was awaited and for how long, and every task's stack
    2. cancel the body
    3. print the state of the services in `state` (queues ready / unacked /
       consumers, nodes up), each asked with a deadline of its own
    4. raise `DeadlineExceeded` naming the wait

A wait whose expiry is an answer (a poll, an attempt in a retry loop) takes
a `timeout=` or `asyncio.wait_for` instead: nothing to report there.

`tests/test_bounded_waits.py` fails on an await in proving/ of a call known
to wait without end (a connect, a declare, a get, a process wait) that
neither carries a `timeout=`, nor sits in `deadline`, `within`,
`asyncio.timeout` or `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

T = TypeVar("T")

# How long each service may take to describe itself after a deadline passed.
STATE_DEADLINE_S = 15.0
# One call to a service that answers in milliseconds when it is there (a query,
# a declare, a get, a connect): one with no answer in a minute has none coming.
ANSWER_S = 60.0


class DeadlineExceeded(TimeoutError):
    """A wait on another party did not end in time; the message names the wait."""


class ServiceState(Protocol):
    """A service that can say what it is doing (for the report at a deadline)."""

    async def state(self) -> Sequence[str]: ...


def _awaiting(coro: object) -> Iterator[str]:
    """`file:line function` of each coroutine in the chain `coro` awaits, outermost first.

    `Task.print_stack` shows a suspended task's outer frame only; where it
    waits is at the end of its `cr_await` chain.
    """
    depth = 0
    while coro is not None and depth < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        depth += 1


def task_stacks() -> str:
    """Every task of the running loop and the chain of awaits it is suspended in."""
    out = io.StringIO()
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        out.write(f"--- task {task.get_name()}\n")
        for line in _awaiting(task.get_coro()):
            out.write(f"    {line}\n")
        if not task.get_coro():
            task.print_stack(limit=12, file=out)
    return out.getvalue()


async def services_state(state: Sequence[ServiceState]) -> list[str]:
    """Each service's own lines, or why it could not give them within STATE_DEADLINE_S."""
    lines: list[str] = []
    for service in state:
        try:
            async with asyncio.timeout(STATE_DEADLINE_S):
                lines += await service.state()
        except Exception as exc:  # a report must not hide the deadline it reports
            lines.append(f"{service!r}: no state within {STATE_DEADLINE_S:.0f} s: {exc!r}")
    return lines


@asynccontextmanager
async def deadline(
    seconds: float, what: str, *, state: Sequence[ServiceState] = ()
) -> AsyncIterator[None]:
    """Bound the body to `seconds`; past them, report (steps 1 to 3) and raise (step 4)."""
    loop = asyncio.get_running_loop()
    expired = False

    def expire(scope: asyncio.Timeout) -> None:
        nonlocal expired
        expired = True
        # 1. the stacks now, while the body still waits where it hung
        print(
            f"deadline: {what}: nothing after {seconds:.1f} s; every task's stack:\n"
            f"{task_stacks()}",
            file=sys.stderr,
            flush=True,
        )
        scope.reschedule(loop.time())  # 2. the body is cancelled from here

    try:
        async with asyncio.timeout(None) as scope:
            handle = loop.call_later(seconds, expire, scope)
            try:
                yield
            finally:
                handle.cancel()
    except TimeoutError:
        if not expired:
            raise  # an inner bound of the body's own
        # 3. what the services say they are doing
        lines = await services_state(state)
        if lines:
            print("deadline: the services' state:\n  " + "\n  ".join(lines), file=sys.stderr)
            sys.stderr.flush()
        # 4.
        raise DeadlineExceeded(f"{what}: no end within {seconds:.1f} s") from None


async def within(
    seconds: float, what: str, awaitable: Awaitable[T], *, state: Sequence[ServiceState] = ()
) -> T:
    """`awaitable`'s result, under `deadline(seconds, what, state=state)`."""
    async with deadline(seconds, what, state=state):
        return await awaitable
