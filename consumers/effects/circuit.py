"""A circuit breaker per provider: our credentials refused pauses it, a probe resumes it.

A `ProviderConfigurationError` (APNs InvalidProviderToken, BadTopic...; FCM 401,
OAuth refused) is not the push's fault: every other push would be refused the
same way. So the first one opens the provider's circuit, with one loud
`provider_paused` error line, and from then on the effects runner sends nothing
to that provider: its targets go back to `claimed` and their jobs wait in a
delay tier without spending an attempt. Every `probe_seconds` (doubling up to
`MAX_PROBE_SECONDS` while refusals go on) one send goes through as a probe;
an answer that shows the provider took our credentials (accepted, or judged
the push itself) closes the circuit (`provider_resumed`).

```
closed --configuration error--> open --probe due--> probing --accepted--> closed
                                  ^                     |
                                  +----refused again----+
```

`Circuits.views()` is what health and metrics read: one `CircuitView` per
provider that has been used, with its state and the reason it opened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)

MAX_PROBE_SECONDS = 60.0


class CircuitState(StrEnum):
    CLOSED = "closed"  # sending
    OPEN = "open"  # paused: our credentials or configuration were refused
    PROBING = "probing"  # paused, one probe send in flight


class ProbeResult(StrEnum):
    ACCEPTED = "accepted"  # the provider took our credentials (sent, or judged the push)
    REFUSED = "refused"  # a configuration error again
    INCONCLUSIVE = "inconclusive"  # no word on credentials: timeout, 5xx, not started


@dataclass(frozen=True, slots=True, kw_only=True)
class CircuitView:
    """One provider's circuit as health checks and metrics see it."""

    consumer: str
    provider: str
    state: CircuitState
    reason: str | None  # why it opened; None when closed
    open_seconds: float  # how long it has been paused; 0 when closed


class ProviderCircuit:
    """The breaker of one provider on one queue."""

    def __init__(
        self,
        consumer: str,
        provider: str,
        *,
        probe_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.state = CircuitState.CLOSED
        self.reason: str | None = None
        self._probe_seconds = probe_seconds
        self._interval = probe_seconds
        self._clock = clock
        self._opened_at = 0.0
        self._next_probe = 0.0

    def admit(self) -> bool:
        """May a send go now? Closed: yes. Open with a probe due: this one, as the probe."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN and self._clock() >= self._next_probe:
            self.state = CircuitState.PROBING
            return True
        return False

    def seconds_to_probe(self) -> float:
        """How long a deferred job should wait: until the next probe may go."""
        if self.state is CircuitState.CLOSED:
            return 0.0
        return max(self._next_probe - self._clock(), 0.0)

    def observe(self, result: ProbeResult, reason: str = "") -> None:
        """What an admitted send's answer says about our credentials."""
        now = self._clock()
        if result is ProbeResult.REFUSED:
            if self.state is CircuitState.CLOSED:
                self._opened_at = now
                self._interval = self._probe_seconds
                log.error(
                    "provider_paused",
                    consumer=self.consumer,
                    provider=self.provider,
                    reason=reason,
                    probe_s=self._interval,
                    action="credentials or configuration refused: no push fails, "
                    "jobs wait; fix the provider settings, a probe resumes sending",
                )
            elif self.state is CircuitState.PROBING:
                ceiling = max(MAX_PROBE_SECONDS, self._probe_seconds)
                self._interval = min(self._interval * 2, ceiling)
                log.warning(
                    "provider_probe_refused",
                    consumer=self.consumer,
                    provider=self.provider,
                    reason=reason,
                    next_probe_s=self._interval,
                )
            if self.state is not CircuitState.OPEN or now >= self._next_probe:
                self._next_probe = now + self._interval
            self.state = CircuitState.OPEN
            self.reason = reason
        elif result is ProbeResult.ACCEPTED:
            if self.state is not CircuitState.CLOSED:
                log.warning(
                    "provider_resumed",
                    consumer=self.consumer,
                    provider=self.provider,
                    paused_s=round(now - self._opened_at, 3),
                )
            self.state = CircuitState.CLOSED
            self.reason = None
        elif self.state is CircuitState.PROBING:  # no word either way: probe again later
            self.state = CircuitState.OPEN
            self._next_probe = now + self._interval

    def view(self) -> CircuitView:
        closed = self.state is CircuitState.CLOSED
        return CircuitView(
            consumer=self.consumer,
            provider=self.provider,
            state=self.state,
            reason=self.reason,
            open_seconds=0.0 if closed else self._clock() - self._opened_at,
        )


class Circuits:
    """The circuits of one effects queue, by provider name, shared by its runners."""

    def __init__(self, consumer: str, *, probe_seconds: float) -> None:
        self.consumer = consumer
        self.probe_seconds = probe_seconds
        self._circuits: dict[str, ProviderCircuit] = {}

    def of(self, provider: str) -> ProviderCircuit:
        circuit = self._circuits.get(provider)
        if circuit is None:
            circuit = self._circuits[provider] = ProviderCircuit(
                self.consumer, provider, probe_seconds=self.probe_seconds
            )
        return circuit

    def views(self) -> list[CircuitView]:
        return [c.view() for c in self._circuits.values()]
