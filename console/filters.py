"""The filters of a list, a dry run and a replay, as a page's query or a form gives them.

Blank fields filter nothing. `exact` (set by the one-message page) makes a
blank tenant mean "no tenant" rather than "any tenant", so that page's
buttons act on that one key only. `digest` (`DeadLetter.digest`) picks one
dead letter by its content: the page of one without a usable message_id.
"""

from __future__ import annotations

import argparse
import datetime
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from consumers.commands.dlq import since as parse_since
from consumers.commands.replay import Selection

MOST = 1000  # at most this many messages one action takes


class BadFilter(ValueError):
    """A filter the console cannot read (a `since` that is not 2h, 7d or an ISO time)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Filters:
    reason: str = ""
    message_id: str = ""
    tenant: str = ""
    exact: bool = False  # the tenant is exact, even blank: one key's page
    since: str = ""
    digest: str = ""
    limit: int = 100

    @classmethod
    def read(cls, fields: Mapping[str, str]) -> Filters:
        try:
            limit = int(fields.get("limit") or 100)
        except ValueError as exc:
            raise BadFilter(f"limit {fields.get('limit')!r} is not a number") from exc
        return cls(
            reason=fields.get("reason", ""),
            message_id=fields.get("message_id", ""),
            tenant=fields.get("tenant", ""),
            exact=fields.get("exact", "") == "1",
            since=fields.get("since", ""),
            digest=fields.get("digest", ""),
            limit=max(1, min(limit, MOST)),
        )

    def selection(self) -> Selection:
        return Selection(
            reason=self.reason or None,
            message_id=self.message_id or None,
            tenant=self.tenant if self.tenant or self.exact else None,
            since=self._since(),
            digest=self.digest or None,
            limit=self.limit,
        )

    def _since(self) -> datetime.datetime | None:
        if not self.since:
            return None
        try:
            return parse_since(self.since)
        except argparse.ArgumentTypeError as exc:
            raise BadFilter(str(exc)) from exc

    def fields(self) -> dict[str, str]:
        """The non-blank filters, as form fields."""
        found = {
            "reason": self.reason,
            "message_id": self.message_id,
            "tenant": self.tenant,
            "exact": "1" if self.exact else "",
            "since": self.since,
            "digest": self.digest,
            "limit": str(self.limit) if self.limit != 100 else "",
        }
        return {name: value for name, value in found.items() if value}

    def query(self) -> str:
        return urllib.parse.urlencode(self.fields())

    def describe(self) -> str:
        """For the audit: what the operator chose."""
        shown = {**self.fields(), "limit": str(self.limit)}
        if self.exact and not self.tenant:
            shown["tenant"] = "(none)"
        shown.pop("exact", None)
        return " ".join(f"{name}={value}" for name, value in shown.items())
