"""Route each push by platform: iOS to APNs, Android and web to FCM."""

from __future__ import annotations

from providers.ids import SendIds
from providers.provider import NEITHER, Provider, ProviderReceipt
from providers.push import Platform, Push


class PlatformRouter:
    """A `Provider` that hands iOS pushes to `apns` and Android and web pushes to `fcm`."""

    name = "router"
    recovery = NEITHER

    def __init__(self, *, apns: Provider, fcm: Provider) -> None:
        self.apns = apns
        self.fcm = fcm
        self.answer_seconds = max(apns.answer_seconds, fcm.answer_seconds)

    @property
    def max_in_flight(self) -> int:
        return self.apns.max_in_flight + self.fcm.max_in_flight

    @property
    def senders(self) -> tuple[Provider, ...]:
        """The providers inside, each once."""
        return (self.apns, self.fcm)

    def provider_for(self, platform: str) -> Provider:
        """The provider of a target's platform (a `Platform`, or a ledger row's channel)."""
        return self.apns if platform == Platform.IOS else self.fcm

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        return await self.provider_for(push.target.platform).send(push, ids, deadline=deadline)

    async def aclose(self) -> None:
        try:
            await self.apns.aclose()
        finally:
            await self.fcm.aclose()
