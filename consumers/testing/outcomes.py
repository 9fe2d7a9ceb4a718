"""What became of each message, as a test awaits it: the worker's own outcome lines.

A worker logs one line per settled delivery (`effect_committed`,
`duplicate_ignored`, `retry_scheduled`, `dead_lettered`, `message_id_reused`;
`consumers.message.verdict.Outcome`) with its consumer, tenant, message_id,
attempt and reason. While a `TestWorker` runs, an `OutcomeTap` sits first in
structlog's processor chain: it copies the lines of that worker's queues and
hands every event on unchanged, so the test's log output stays what it was.
No hook in the worker or its settings: the tap reads what production logs.

A wait takes the first line not taken by an earlier wait that matches, so
two `duplicate_ignored(...)` calls await two lines. It ends:

1. with that line, as soon as it is logged;
2. at once, when every publish of the message through the kit has settled
   (committed, ignored, dead-lettered) and none matched: what was awaited can
   no longer come;
3. at its deadline.

2 and 3 raise `OutcomeNotSeen`, an AssertionError (pytest shows it as the
test's failure) that names what was awaited, for how long, and every line
seen for that message instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from consumers.message.verdict import Outcome

# Lines that end a delivery's story: anything else (a retry) is followed by another.
SETTLED = frozenset(
    {
        Outcome.EFFECT_COMMITTED,
        Outcome.DUPLICATE_IGNORED,
        Outcome.DEAD_LETTERED,
        Outcome.MESSAGE_ID_REUSED,
        Outcome.MESSAGE_CANCELLED,
    }
)
# What each of TestWorker's waits takes; `message_id_reused` is a dead letter too.
COMMITTED = frozenset({str(Outcome.EFFECT_COMMITTED)})
IGNORED = frozenset({str(Outcome.DUPLICATE_IGNORED)})
RETRIED = frozenset({str(Outcome.RETRY_SCHEDULED)})
DEAD = frozenset({str(Outcome.DEAD_LETTERED), str(Outcome.MESSAGE_ID_REUSED)})
_EVENTS = frozenset(str(outcome) for outcome in Outcome)


class OutcomeNotSeen(AssertionError):
    """The outcome awaited did not come; the message says what came instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeLine:
    """One outcome line of the worker, its queue named as the app names it."""

    outcome: str  # the event: effect_committed, duplicate_ignored, retry_scheduled, ...
    queue: str
    message_id: str
    tenant: str
    attempt: int
    reason: str = ""
    error: str = ""  # a handler's exception, `Type: text`
    delay_s: float | None = None  # the retry tier it waits in
    fields: Mapping[str, Any] = field(default_factory=dict)  # the whole line as logged

    def __str__(self) -> str:
        extra = "".join(
            f" {name} {value!r}"
            for name, value in (("reason", self.reason), ("error", self.error))
            if value
        )
        return (
            f"{self.outcome} of {self.message_id!r} (queue {self.queue!r},"
            f" tenant {self.tenant!r}, attempt {self.attempt}){extra}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Awaited:
    """Which line a wait takes: None matches any."""

    outcomes: frozenset[str]
    message_id: str
    tenant: str = ""
    queue: str | None = None
    attempt: int | None = None
    reason: str | None = None

    def concerns(self, line: OutcomeLine) -> bool:
        """The line is about the awaited message (whatever its outcome)."""
        return (
            line.message_id == self.message_id
            and line.tenant == self.tenant
            and (self.queue is None or line.queue == self.queue)
        )

    def matches(self, line: OutcomeLine) -> bool:
        return (
            self.concerns(line)
            and line.outcome in self.outcomes
            and (self.attempt is None or line.attempt == self.attempt)
            and (self.reason is None or line.reason == self.reason)
        )

    def __str__(self) -> str:
        what = " or ".join(sorted(self.outcomes))
        where = f"queue {self.queue!r}" if self.queue is not None else "any queue"
        conditions = "".join(
            f", {name} {value!r}"
            for name, value in (("attempt", self.attempt), ("reason", self.reason))
            if value is not None
        )
        return (
            f"{what} of message {self.message_id!r} ({where}, tenant {self.tenant!r}{conditions})"
        )


class OutcomeTap:
    """A structlog processor that keeps the outcome lines of some queues.

    `queues` maps each queue's name on the broker to the app's name for it.
    """

    def __init__(self, queues: Mapping[str, str]) -> None:
        self._queues = dict(queues)
        self.lines: list[OutcomeLine] = []
        self._taken: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._processors: list[Any] | None = None

    def attach(self) -> None:
        """Put the tap first in structlog's chain (the list itself, as loggers hold it)."""
        self._loop = asyncio.get_running_loop()
        self._processors = structlog.get_config()["processors"]
        self._processors.insert(0, self)

    def detach(self) -> None:
        if self._processors is not None:
            self._processors[:] = [p for p in self._processors if p is not self]
            self._processors = None

    def __call__(
        self, logger: object, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event = event_dict.get("event")
        queue = self._queues.get(str(event_dict.get("consumer")))
        if event in _EVENTS and queue is not None:
            self._keep(_line(str(event), queue, event_dict))
        return event_dict

    def _keep(self, line: OutcomeLine) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # logged from a thread of no loop
            running = None
        if running is self._loop:
            self.lines.append(line)
            self._changed.set()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._keep, line)  # to the loop the waits run on

    async def wait(self, awaited: Awaited, *, published: int, timeout: float) -> OutcomeLine:
        """The first line not taken yet that matches `awaited` (see the module's steps)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._changed.clear()  # before the look: a line logged after it sets it again
            for index, line in enumerate(self.lines):
                if index not in self._taken and awaited.matches(line):
                    self._taken.add(index)
                    return line  # 1.
            seen = [line for line in self.lines if awaited.concerns(line)]
            settled = sum(1 for line in seen if line.outcome in SETTLED)
            if published and settled >= published:  # 2.
                raise OutcomeNotSeen(
                    f"awaited {awaited}: it was published {published} time(s) and every"
                    f" publish settled otherwise. Seen for it:\n{self._listed(seen)}"
                )
            left = deadline - loop.time()
            if left <= 0:  # 3.
                others = [line for line in self.lines if not awaited.concerns(line)]
                raise OutcomeNotSeen(
                    f"no {awaited} within {timeout:g} s (published {published} time(s)"
                    f" through the kit). Seen for it: {self._listed(seen) or 'nothing'}\n"
                    f"Other outcome lines of the app's queues ({len(others)}):"
                    f"\n{self._listed(others[-10:])}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def _listed(self, lines: list[OutcomeLine]) -> str:
        taken = {id(self.lines[index]) for index in self._taken}
        return "\n".join(
            f"  {line}{' (taken by an earlier wait)' if id(line) in taken else ''}"
            for line in lines
        )


def _line(event: str, queue: str, fields: Mapping[str, Any]) -> OutcomeLine:
    def text(key: str) -> str:
        return str(fields.get(key) or "")

    delay = fields.get("delay_s")
    attempt = fields.get("attempt")
    return OutcomeLine(
        outcome=event,
        queue=queue,
        message_id=text("message_id"),
        tenant=text("tenant"),
        attempt=attempt if isinstance(attempt, int) else 0,
        reason=text("reason"),
        error=text("error"),
        delay_s=float(delay) if isinstance(delay, int | float) else None,
        fields=dict(fields),
    )
