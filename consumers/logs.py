"""Configure structlog once, from the CLI: JSON off a terminal, console on one.

A worker writes one JSON line per outcome, so a line's cost is paid per
message. The standard configuration (json.dumps, `datetime.isoformat` per
line, a text stream) cost about 20 us a line to a file on the bench machine,
as much as the rest of our per-message work. The JSON path here renders with
orjson (falling back to json.dumps for what orjson refuses, such as an int
past 64 bits), formats the timestamp's date and time once per second, and
writes bytes: the same keys and values, one line per call, about 10 us.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from typing import Any, BinaryIO

import orjson
import structlog
from structlog.typing import EventDict, WrappedLogger


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


def configure_logging(
    level: str = "info", *, json: bool | None = None, file: BinaryIO | None = None
) -> None:
    """Set up structlog; `json=None` picks JSON when stderr is not a terminal.

    JSON lines go to `file` (default: stderr); console lines always to stderr.
    """
    as_json = (not sys.stderr.isatty()) if json is None else json
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        IsoTimestamp(),
        structlog.processors.format_exc_info,
    ]
    factory: Any
    if as_json:
        shared.append(structlog.processors.JSONRenderer(serializer=_dumps))
        factory = structlog.BytesLoggerFactory(file=file or sys.stderr.buffer)
    else:
        shared.append(structlog.dev.ConsoleRenderer())
        factory = structlog.WriteLoggerFactory(file=sys.stderr)
    structlog.configure(
        processors=shared,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
