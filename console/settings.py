"""The console's settings: where it listens, which queues its first page shows.

Read from the environment in `ConsoleSettings.from_env(mapping)` only, called
by `idempotent-workers console`; the command's flags override them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleSettings:
    host: str = "127.0.0.1"  # the operator's machine only, unless told otherwise
    port: int = 8300
    queues: tuple[str, ...] = ()  # the work queues whose DLQs the first page shows
    metrics_urls: tuple[str, ...] = ()  # the workers' /metrics, linked from every page
    scan: int = 10_000  # dead letters read at most per page
    origins: tuple[str, ...] = ()  # where else its pages are served from (a proxy's https://...)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ConsoleSettings:
        """IW_CONSOLE_HOST, IW_CONSOLE_PORT, IW_CONSOLE_SCAN, and IW_CONSOLE_QUEUES,
        IW_CONSOLE_METRICS and IW_CONSOLE_ORIGINS (commas)."""
        base = cls()
        return cls(
            host=env.get("IW_CONSOLE_HOST", base.host),
            port=int(env.get("IW_CONSOLE_PORT", str(base.port))),
            queues=_list(env.get("IW_CONSOLE_QUEUES", "")),
            metrics_urls=_list(env.get("IW_CONSOLE_METRICS", "")),
            scan=int(env.get("IW_CONSOLE_SCAN", str(base.scan))),
            origins=_list(env.get("IW_CONSOLE_ORIGINS", "")),
        )


def _list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())
