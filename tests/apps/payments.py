"""The payments API of the tests: the chaos profiles' own (`proving.chaos.channels.payments`),
under the names the tests use, one that replays by key within Stripe's 24 hours, one whose
provider is asked by key first."""

from __future__ import annotations

from proving.chaos.channels.payments import LookedUpPayments as LookedUpPaymentsApi
from proving.chaos.channels.payments import Payments as PaymentsApi

__all__ = ["LookedUpPaymentsApi", "PaymentsApi"]
