"""Raw AMQP publishing for the tests: see `proving.rawamqp`, where it lives."""

from __future__ import annotations

from proving.rawamqp import RawProperties, RawPublisher, publish_raw

__all__ = ["RawProperties", "RawPublisher", "publish_raw"]
