"""The app: a registry of handlers, one per queue.

    app = App()

    @app.handler("orders.shipped")
    async def record_shipment(ctx: Context) -> None:
        await ctx.tx.execute("INSERT INTO shipments (order_id) VALUES ($1)", ctx.body["order_id"])

The queue name is also the consumer's name, the first part of every dedupe key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from consumers.handlers.faults import NO_FAULTS, Faults
from consumers.handlers.retry import RetryPolicy
from consumers.handlers.spec import (
    BatchHandler,
    EffectSpec,
    HandlerSpec,
    InvalidTokenHook,
    MessageHandler,
    ProviderFactory,
)
from consumers.jobs.api import ApiKind
from consumers.jobs.email import EMAIL
from consumers.jobs.kind import EffectKind
from consumers.jobs.push import PUSH
from consumers.jobs.webhook import WebhookKind, webhook_sender
from consumers.message.decisions import ConfigurationError
from consumers.message.envelope import Fingerprinter
from consumers.settings import WebhookSettings
from dedupe import UnknownOutcome
from providers import ApiSettings, Sender, SmtpSettings

if TYPE_CHECKING:  # httpx (the `api` extra) loads when a worker builds the sender
    from providers.idempotent_api import IdempotentApi


class App:
    """Handlers by queue. Pass it to `Worker` or `idempotent-workers run MODULE:APP`."""

    def __init__(self, *, retry: RetryPolicy | None = None, faults: Faults = NO_FAULTS) -> None:
        self.retry = retry or RetryPolicy()
        # Crash tests and the chaos app install a Faults here; production never does.
        self.faults = faults
        self._specs: dict[str, HandlerSpec] = {}

    @property
    def specs(self) -> Mapping[str, HandlerSpec]:
        return self._specs

    def handler(
        self,
        queue: str,
        *,
        retry: RetryPolicy | None = None,
        fingerprint: Fingerprinter | None = None,
        timeout: float | None = None,
    ) -> Callable[[MessageHandler], MessageHandler]:
        """Register `fn(ctx)` for every message on `queue`.

        `timeout`: the handler's deadline in seconds (default: the worker's
        `handler_timeout_seconds`, IW_HANDLER_TIMEOUT). Past it the handler is
        cancelled, its effects rolled back and its message retried
        (`handler_timeout`); the rest of the batch commits.
        """

        def register(fn: MessageHandler) -> MessageHandler:
            self._add(
                HandlerSpec(
                    queue=queue,
                    handle=fn,
                    retry=retry or self.retry,
                    fingerprint=fingerprint,
                    timeout=_positive(timeout),
                )
            )
            return fn

        return register

    def batch_handler(
        self,
        queue: str,
        *,
        retry: RetryPolicy | None = None,
        fingerprint: Fingerprinter | None = None,
        timeout: float | None = None,
    ) -> Callable[[BatchHandler], BatchHandler]:
        """Register `fn(batch)` that writes a whole batch's effects at once.

        It gets only the batch's new messages (duplicates are already acked);
        if it raises, or runs past `timeout` (the deadline of one call), the
        batch is split to find the failing message, and the others' effects
        still commit exactly once.
        """

        def register(fn: BatchHandler) -> BatchHandler:
            self._add(
                HandlerSpec(
                    queue=queue,
                    handle_batch=fn,
                    retry=retry or self.retry,
                    fingerprint=fingerprint,
                    timeout=_positive(timeout),
                )
            )
            return fn

        return register

    def push_handler(
        self,
        queue: str,
        *,
        provider: ProviderFactory,
        on_invalid_token: InvalidTokenHook | None = None,
        unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
        lease_seconds: float = 30.0,
        probe_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Send the push jobs of `queue` (format: `consumers.jobs.push`) through `provider`.

        `provider` is called once, inside the worker's event loop, to build the
        Provider (aioapns needs the running loop). `on_invalid_token(tx, dead)`
        runs once per dead token, in the transaction that records it.
        `lease_seconds` must exceed the provider's own timeout: no send starts
        unless its answer is due before the lease ends. A provider that refuses
        our credentials is paused; `probe_seconds` later (doubling to a minute)
        one send probes it (see `consumers.effects.circuit`).
        """
        self.effect_handler(
            queue,
            kind=PUSH,
            provider=provider,
            on_dead_target=on_invalid_token,
            unknown_outcome=unknown_outcome,
            lease_seconds=lease_seconds,
            probe_seconds=probe_seconds,
            retry=retry,
        )

    def webhook_handler(
        self,
        queue: str,
        *,
        settings: WebhookSettings | None = None,
        unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
        lease_seconds: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Send the webhook jobs of `queue` (format: `consumers.jobs.webhook`) to the
        tenant's endpoints, signed per the Standard Webhooks specification.

        `settings`: the sender's timeouts and connections, the endpoint cache and the
        http allow-list; None: the worker's `Settings.webhooks` (IW_WEBHOOK_*), whose
        key (IW_WEBHOOK_SECRETS_KEY) also serves settings given without one. The
        sender's timeouts and connections come from `settings` given here, or their
        defaults. A call whose outcome is unknown is sent again with the same
        webhook-id (RESEND), which the receiver dedupes by; SKIP never sends it again.
        Retries back off with jitter over `retry`'s tiers, never sooner than a
        receiver's Retry-After.
        """
        self.effect_handler(
            queue,
            kind=WebhookKind(settings),
            provider=webhook_sender(settings),
            unknown_outcome=unknown_outcome,
            lease_seconds=lease_seconds,
            retry=retry,
        )

    def effect_handler(
        self,
        queue: str,
        *,
        kind: EffectKind[Any],
        provider: ProviderFactory,
        on_dead_target: InvalidTokenHook | None = None,
        unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
        lease_seconds: float = 30.0,
        probe_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Make the external effects the jobs of `queue` ask for, through the send ledger.

        `kind` reads the jobs (`consumers.jobs`: push, webhook, email, an API's),
        `provider` builds the sender once inside the worker's loop. Each target
        is sent once, with stable ids, under a lease; what an unknown outcome
        leads to follows what the channel offers (`providers.Recovery`), and
        `unknown_outcome` for a channel that offers neither replay nor lookup.
        `on_dead_target(tx, dead)` runs once per target the provider called dead.
        """
        if lease_seconds <= 0:
            raise ConfigurationError("lease_seconds must be positive")
        if probe_seconds <= 0:
            raise ConfigurationError("probe_seconds must be positive")
        self._add(
            HandlerSpec(
                queue=queue,
                effects=EffectSpec(
                    kind=kind,
                    provider=provider,
                    on_invalid_token=on_dead_target,
                    unknown_outcome=unknown_outcome,
                    lease_seconds=lease_seconds,
                    probe_seconds=probe_seconds,
                ),
                retry=retry or self.retry,
            )
        )

    def email_handler(
        self,
        queue: str,
        *,
        settings: SmtpSettings,
        on_dead_address: InvalidTokenHook | None = None,
        unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
        lease_seconds: float = 30.0,
        probe_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Send the e-mail jobs of `queue` (format: `consumers.jobs.email`) over SMTP.

        One effect per recipient, through `providers.SmtpSender(settings)` (the `mail`
        extra), built once inside the worker's loop. SMTP can be neither replayed nor
        asked, so a send whose outcome is unknown follows `unknown_outcome`: RESEND
        with the same Message-ID (a receiver that dedupes by it drops the copy), or
        SKIP. `on_dead_address(tx, dead)` runs once per address the server called
        dead (5xx to RCPT), in the transaction that records it: suppress it there.
        Otherwise as `effect_handler`.
        """

        async def sender() -> Sender[Any]:
            from providers.smtp import SmtpSender  # aiosmtplib: the `mail` extra

            return SmtpSender(settings)

        self.effect_handler(
            queue,
            kind=EMAIL,
            provider=sender,
            on_dead_target=on_dead_address,
            unknown_outcome=unknown_outcome,
            lease_seconds=lease_seconds,
            probe_seconds=probe_seconds,
            retry=retry,
        )

    def api_handler(
        self,
        queue: str,
        *,
        api: type[IdempotentApi],
        settings: ApiSettings | None = None,
        build: Callable[[], Awaitable[IdempotentApi]] | None = None,
        on_dead_target: InvalidTokenHook | None = None,
        unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
        lease_seconds: float = 30.0,
        probe_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Make the calls the jobs of `queue` ask of `api` (a subclass of
        `providers.IdempotentApi`; format: `consumers.jobs.api`), one per job.

        `api(settings)` is built once inside the worker's loop (httpx: the `api`
        extra), or `build()` when given: an instance of `api` made another way
        (credentials read at start, an httpx transport of its own). Each call
        carries its idempotency key; after a crash the call is replayed within the
        API's window, or looked up first, as its `recovery` says (`unknown_outcome`
        only for an API that offers neither). Otherwise as `effect_handler`.
        """
        if build is not None and settings is not None:
            raise ConfigurationError("api_handler: settings or build, not both")

        async def sender() -> Sender[Any]:
            made = api(settings) if build is None else await build()
            if not isinstance(made, api):
                raise ConfigurationError(f"build() made {type(made).__name__}, not {api.__name__}")
            return made

        self.effect_handler(
            queue,
            kind=ApiKind(api),
            provider=sender,
            on_dead_target=on_dead_target,
            unknown_outcome=unknown_outcome,
            lease_seconds=lease_seconds,
            probe_seconds=probe_seconds,
            retry=retry,
        )

    def _add(self, spec: HandlerSpec) -> None:
        if not spec.queue or len(spec.queue.encode()) > 200:
            raise ConfigurationError(f"bad queue name {spec.queue!r}: 1 to 200 bytes")
        if spec.queue in self._specs:
            raise ConfigurationError(f"queue {spec.queue!r} already has a handler")
        self._specs[spec.queue] = spec


def _positive(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise ConfigurationError(f"a handler timeout must be positive, got {timeout!r}")
    return timeout
