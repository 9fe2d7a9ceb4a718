"""Route each push by its target: iOS to APNs, Android to FCM, web to Web Push or FCM.

A web target is either a Web Push subscription (an endpoint and its keys) or an
FCM web registration token (a token alone, as jobs carried before Web Push was
here). Only a Web Push service can take the first and only FCM the second, so
each has a channel of its own (`Target.channel`, the ledger row's channel):

    target                               channel    goes to
    ios                                  ios        apns
    android                              android    fcm
    web, token only (FCM web token)      web        fcm
    web, endpoint and keys               webpush    webpush

A router built without `webpush` (as every router was before it existed) still
sends what it sent before; a Web Push subscription meets `WebPushNotConfigured`,
a `ProviderConfigurationError` of the provider named "webpush": nothing is sent
or lost, its circuit opens with one `provider_paused` line naming the fix, the
worker reports not ready, and its jobs wait without spending attempts until a
worker with a Web Push provider takes them.
"""

from __future__ import annotations

from providers.errors import ProviderConfigurationError
from providers.ids import SendIds
from providers.provider import NEITHER, Provider, ProviderReceipt
from providers.push import WEBPUSH_CHANNEL, Platform, Push


class WebPushNotConfigured:
    """The router's "webpush" when none was given: refuses every send, as configuration."""

    name = "webpush"
    recovery = NEITHER
    answer_seconds = 0.0
    max_in_flight = 1

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        raise ProviderConfigurationError(
            "WebPushNotConfigured: a Web Push subscription, and no Web Push provider:"
            " build the router with PlatformRouter(..., webpush=WebPushProvider(...))",
            provider=self.name,
        )

    async def aclose(self) -> None:
        return None


class PlatformRouter:
    """A `Provider` that hands each push to `apns`, `fcm` or `webpush` (module docstring)."""

    name = "router"
    recovery = NEITHER

    def __init__(self, *, apns: Provider, fcm: Provider, webpush: Provider | None = None) -> None:
        self.apns = apns
        self.fcm = fcm
        self.webpush: Provider = webpush if webpush is not None else WebPushNotConfigured()
        self.answer_seconds = max(p.answer_seconds for p in self.senders)

    @property
    def max_in_flight(self) -> int:
        return sum(p.max_in_flight for p in self.senders)

    @property
    def senders(self) -> tuple[Provider, ...]:
        """The providers inside, each once (the stand-in refusing subscriptions, if no
        `webpush` was given)."""
        return (self.apns, self.fcm, self.webpush)

    def provider_for(self, channel: str) -> Provider:
        """The provider of a target's channel (`Target.channel`, or a ledger row's)."""
        if channel == Platform.IOS:
            return self.apns
        return self.webpush if channel == WEBPUSH_CHANNEL else self.fcm

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        return await self.provider_for(push.target.channel).send(push, ids, deadline=deadline)

    async def aclose(self) -> None:
        try:
            await self.apns.aclose()
        finally:
            try:
                await self.fcm.aclose()
            finally:
                await self.webpush.aclose()
