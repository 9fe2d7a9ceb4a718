"""Configure structlog once, from the CLI: JSON off a terminal, console on one.

A worker writes one JSON line per outcome, so a line's cost is paid per
message. The standard configuration (json.dumps, `datetime.isoformat` per
line, a text stream) cost about 20 us a line to a file on the bench machine,
as much as the rest of our per-message work. The JSON path here renders with
orjson (falling back to json.dumps for what orjson refuses, such as an int
past 64 bits), formats the timestamp's date and time once per second, and
writes bytes: the same keys and values, one line per call, about 15 us.

The outcome lines (one per message) can go faster still: `outcome_lines()`
renders them without structlog's processor chain, the same bytes the chain
would write (a test holds it to that), and writes a batch's lines with one
write. It does so only while structlog holds the JSON set-up made here and
no context variables are bound; otherwise it answers None and the lines go
through structlog.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson
import structlog
from structlog.typing import EventDict, WrappedLogger

from consumers.telemetry.tracing import add_trace_ids
from dedupe.lost import quiet_pool_logs


class IsoTimestamp:
    """Adds `timestamp`: UTC ISO 8601 with microseconds (`2024-05-04T10:21:33.123456Z`)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
        now = time.time()
        second = int(now)
        if second != self._second:
            moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
            self._prefix = moment.strftime("%Y-%m-%dT%H:%M:%S")
            self._second = second
        event_dict["timestamp"] = f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"
        return event_dict


def _dumps(value: Any, default: Any = None) -> bytes:
    try:
        return orjson.dumps(value, default=default)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default).encode()


@dataclass(frozen=True, slots=True)
class _JsonSetup:
    """What configure_logging handed structlog in JSON mode."""

    processors: tuple[structlog.typing.Processor, ...]  # a copy: capture_logs edits the list
    file: BinaryIO
    min_level: int
    stamp: IsoTimestamp


_json_setup: _JsonSetup | None = None
_LEVELS = logging.getLevelNamesMapping()
_LINE_LEVELS = {name.lower(): number for name, number in _LEVELS.items()}  # "info" -> 20


class OutcomeLines:
    """One batch's outcome lines, rendered as the JSON chain would, written at once.

    Each line is copied into one buffer as it is rendered, not held as a bytes
    object of its own until the write: orjson renders into a fresh 1 KiB bytes
    object and trims it, and a batch's hundreds of trimmed objects held at once
    cost the allocator more than one freed at once (`python -m proving.bench.lines`:
    8.1 against 2.7 us a line; in a push worker, 5.4 against 3.1).
    """

    __slots__ = ("_buffer", "_setup")

    def __init__(self, setup: _JsonSetup) -> None:
        self._setup = setup
        self._buffer = bytearray()

    def line(self, event: str, level: str, fields: dict[str, Any]) -> None:
        """Queue `fields` (taken over) as the line `log.<level>(event, **fields)` writes."""
        if (rendered := self._rendered(event, level, fields)) is not None:
            self._buffer += rendered
            self._buffer += b"\n"

    def _rendered(self, event: str, level: str, fields: dict[str, Any]) -> bytes | None:
        """The line's JSON, as the chain renders it; None below the configured level."""
        if _LINE_LEVELS[level] < self._setup.min_level:
            return None
        # The chain's key order: the call's fields, event, level, timestamp.
        fields["event"] = event
        fields["level"] = level
        self._setup.stamp(None, level, fields)
        return _dumps(fields)

    def flush(self) -> None:
        if self._buffer:
            # A new buffer, not a cleared one: the file may still hold the old.
            written, self._buffer = self._buffer, bytearray()
            self._setup.file.write(written)
            self._setup.file.flush()


def outcome_lines() -> OutcomeLines | None:
    """The fast path for a batch's outcome lines, or None: log through structlog."""
    setup = _json_setup
    if (
        setup is None
        or tuple(structlog.get_config()["processors"]) != setup.processors
        or structlog.contextvars.get_contextvars()
    ):
        return None
    return OutcomeLines(setup)


def configure_logging(
    level: str = "info", *, json: bool | None = None, file: BinaryIO | None = None
) -> None:
    """Set up structlog; `json=None` picks JSON when stderr is not a terminal.

    JSON lines go to `file` (default: stderr); console lines always to stderr.
    asyncpg's pool warnings during a failover become one line each (`dedupe.lost`).
    """
    quiet_pool_logs()
    as_json = (not sys.stderr.isatty()) if json is None else json
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,  # a line written inside a span: its trace_id and span_id
        structlog.processors.add_log_level,
        IsoTimestamp(),
        structlog.processors.format_exc_info,
    ]
    global _json_setup
    min_level = _LEVELS[level.upper()]
    factory: Any
    if as_json:
        shared.append(structlog.processors.JSONRenderer(serializer=_dumps))
        out = file or sys.stderr.buffer
        factory = structlog.BytesLoggerFactory(file=out)
        stamp = shared[3]
        assert isinstance(stamp, IsoTimestamp)
        _json_setup = _JsonSetup(
            processors=tuple(shared), file=out, min_level=min_level, stamp=stamp
        )
    else:
        shared.append(structlog.dev.ConsoleRenderer())
        factory = structlog.WriteLoggerFactory(file=sys.stderr)
        _json_setup = None
    structlog.configure(
        processors=shared,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
