"""The worker `python -m proving.bench.fanout` runs as a process: every push setting at its
default, pointed at the fakes the bench serves (`providers.fakes.env`, prefix FANOUT_)."""

from __future__ import annotations

import os

from consumers import App
from providers import Provider
from providers.fakes.env import router_from_env

app = App()


async def build_provider() -> Provider:
    return router_from_env(os.environ, "FANOUT_", timeout_seconds=10.0)  # FcmSettings' default


app.push_handler(os.environ.get("FANOUT_QUEUE", "fanout"), provider=build_provider)
