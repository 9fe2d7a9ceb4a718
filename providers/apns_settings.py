"""How to reach APNs and who we are: the settings `ApnsProvider` takes."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from providers.apns_token import REFRESH_SECONDS

PRODUCTION_HOST = "api.push.apple.com"
SANDBOX_HOST = "api.sandbox.push.apple.com"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApnsSettings:
    """How to reach APNs and who we are.

    Auth is a token key (`key`: the .p8 PEM text, `key_id`, `team_id`) or a client
    certificate (`cert_file`, PEM with its key). `host` defaults to Apple's
    production or sandbox host (`use_sandbox`). Server trust: `ssl_context`, or
    `ca_file`, or the system store.
    """

    topic: str
    key: str | None = None
    key_id: str | None = None
    team_id: str | None = None
    cert_file: str | None = None
    host: str | None = None
    port: int = 443
    use_sandbox: bool = False
    ca_file: str | None = None
    ssl_context: ssl.SSLContext | None = None
    timeout_seconds: float = 10.0
    max_connections: int = 10
    token_refresh_seconds: float = REFRESH_SECONDS  # 20 to 55 minutes
