"""An in-memory provider for tests: records every send, answers as scripted per token."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from providers.errors import ProviderError
from providers.ids import SendIds
from providers.provider import NEITHER, ProviderReceipt
from providers.push import Push


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedSend:
    """One call to `RecordingProvider.send`."""

    push: Push
    ids: SendIds


class RecordingProvider:
    """A `Provider` that sends nothing.

    Every send is recorded in `.sends`. By default it succeeds with the apns-id as the
    provider message id; `script(token, ...)` queues answers for a token: a receipt to
    return or a `ProviderError` to raise, used once each, in order.
    """

    answer_seconds = 0.0
    recovery = NEITHER
    max_in_flight = 1000

    def __init__(self, name: str = "recording") -> None:
        self.name = name
        self.sends: list[RecordedSend] = []
        self.closed = False
        self._scripts: dict[str, deque[ProviderReceipt | ProviderError]] = {}

    def script(self, token: str, *answers: ProviderReceipt | ProviderError) -> None:
        self._scripts.setdefault(token, deque()).extend(answers)

    def sends_to(self, token: str) -> list[RecordedSend]:
        return [s for s in self.sends if s.push.target.token == token]

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self.closed:
            raise RuntimeError("RecordingProvider.send after aclose()")
        self.sends.append(RecordedSend(push=push, ids=ids))
        answers = self._scripts.get(push.target.token)
        if answers:
            answer = answers.popleft()
            if isinstance(answer, ProviderError):
                raise answer
            return answer
        return ProviderReceipt(provider=self.name, provider_message_id=ids.effect_id)

    async def aclose(self) -> None:
        self.closed = True
