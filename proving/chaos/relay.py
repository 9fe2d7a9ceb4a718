"""A relay process of the chaos run: `idempotent-workers relay` with the fault seam armed.

    python -m proving.chaos.relay      (the CLI's environment, plus PROVING_CRASH_*)

The same `consumers.publishing.relay.run_relay` the CLI runs, given a `SigkillAt` from
`PROVING_CRASH_AT=after_publish`: the chaos fleet arms some relay starts to
kill themselves after their batch is confirmed and before it is marked.
"""

from __future__ import annotations

import asyncio
import os
import sys

from consumers import Settings, configure_logging
from consumers.publishing.relay import run_relay
from proving.faults import SigkillAt


def main() -> int:
    configure_logging("info")
    return asyncio.run(run_relay(Settings.from_env(), faults=SigkillAt.from_env(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
