"""Intent keys: made by the console when it renders a page, for that sign-in and that button.

A key is what makes a replay or an archive act once (`console.audit`): every
request carrying it after the first shows the first one's outcome. It is
also what tells the console's own button from a forged form. A key is

    nonce (16)  issued (8)  mac (22)          46 characters of [A-Za-z0-9_-]

the nonce 12 random bytes, `issued` the second it was made (hex), and `mac`
the first 16 bytes of an HMAC-SHA256, under a secret the console process
made at its start and never shows, of the nonce, the issue time, the sign-in
(`signin.session_of`), the button (replay or archive), the queue and the
filters. `refusal()` says why it refuses a key

1. not of that shape                           never made by the console
2. whose mac differs                           made for another sign-in, button, queue or
                                               filters, or by a console since restarted
3. issued longer than `LIFETIME` ago            the page is old: open it again

So a form the console did not render for this operator, this button and
exactly these messages cannot act, and a key that acted can never act again
(the audit's primary key), while the page's own key, sent twice, from two
tabs or again later, acts once.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import re
import secrets
import time
from enum import StrEnum

from console.filters import Filters

LIFETIME = datetime.timedelta(hours=12)
_NONCE_BYTES = 12
_MAC_BYTES = 16
_SHAPE = re.compile(r"^([A-Za-z0-9_-]{16})([0-9a-f]{8})([A-Za-z0-9_-]{22})$")


class Button(StrEnum):
    """What a key may do."""

    REPLAY = "replay"
    ARCHIVE = "archive"


class Intents:
    """Makes and checks the intent keys of one console process."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def issue(
        self,
        *,
        session: str,
        button: Button,
        queue: str,
        filters: Filters,
        now: float | None = None,
    ) -> str:
        """A new key for the button of a page being rendered."""
        nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
        issued = f"{int(time.time() if now is None else now):08x}"
        return nonce + issued + self._mac(nonce, issued, session, button, queue, filters)

    def refusal(
        self,
        key: str,
        *,
        session: str,
        button: Button,
        queue: str,
        filters: Filters,
        now: float | None = None,
    ) -> str | None:
        """None if `key` was issued for exactly this; else why it is refused."""
        shape = _SHAPE.match(key)
        if shape is None:  # 1.
            return "the form carries no intent key the console makes"
        nonce, issued, mac = shape.groups()
        wanted = self._mac(nonce, issued, session, button, queue, filters)
        if not hmac.compare_digest(mac, wanted):  # 2.
            return (
                "the form's intent key was not made by this console for this sign-in,"
                f" this {button} button and these messages"
            )
        age = (time.time() if now is None else now) - int(issued, 16)
        if age > LIFETIME.total_seconds():  # 3.
            return f"the page is older than {LIFETIME.total_seconds() / 3600:g} hours"
        return None

    def _mac(
        self, nonce: str, issued: str, session: str, button: Button, queue: str, filters: Filters
    ) -> str:
        chosen = sorted(filters.fields().items())
        bound = json.dumps(["intent/1", nonce, issued, session, button.value, queue, chosen])
        digest = hmac.new(self._secret, bound.encode(), hashlib.sha256).digest()
        return _b64(digest[:_MAC_BYTES])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
