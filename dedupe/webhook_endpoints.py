"""Webhook endpoints per tenant and their signing secrets (tables of migration 0008).

An endpoint is a URL of a tenant's, with the event types it takes (none: every
one). Its secrets are `whsec_` + the base64 of 32 random bytes, as the Standard
Webhooks specification serialises them. A secret must stay usable for signing,
so it cannot be hashed: it is kept encrypted by a `SecretBox` (the caller's, built
from a key the database never sees), and shown whole only when it is made
(`add`, `rotate`); afterwards only its `prefix`.

Rotation: `rotate` makes a new secret and sets the live ones to expire `overlap`
from now; until then every call is signed by each (the receiver may verify with
either), afterwards by the new one alone. `signing` reads what a call needs: the
URL and the live secrets, decrypted, newest first.

`tenant=` on a change (rotate, disable, enable, remove) keeps it to that tenant's
endpoints: another tenant's id is not found (the send API's routes, per API key);
without it (the operator's commands, the worker's 410) any endpoint is.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the specification asks for 24 to 64
SHOWN_CHARS = len(SECRET_PREFIX) + 4  # what `prefix` keeps: whsec_ and 4 of 44 characters


class SecretBox(Protocol):
    """Encrypts a secret for the database and decrypts it back (a Fernet key's, say)."""

    def encrypt(self, data: bytes, /) -> bytes: ...

    def decrypt(self, token: bytes, /) -> bytes: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretView:
    """A secret as it is shown after it was made: its prefix and its dates."""

    prefix: str
    created_at: datetime
    expires_at: datetime | None  # None: current


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookEndpoint:
    id: str
    tenant: str
    url: str
    event_types: tuple[str, ...]  # empty: every event type
    created_at: datetime
    disabled_at: datetime | None
    disabled_reason: str | None
    secrets: tuple[SecretView, ...]  # live ones, newest first


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """An enabled endpoint as a job's recipients are chosen from."""

    tenant: str
    id: str
    event_types: tuple[str, ...]

    def takes(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


@dataclass(frozen=True, slots=True, kw_only=True)
class SigningEndpoint:
    """What a call to an endpoint needs: its URL and its live secrets, newest first
    (kept out of `repr`); `disabled_reason` when it must not be called."""

    id: str
    tenant: str
    url: str
    disabled_reason: str | None
    secrets: tuple[str, ...] = field(repr=False)


_OF_TENANT = "($2::text IS NULL OR tenant = $2)"  # a change's tenant= (module docstring)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def new_endpoint_id() -> str:
    return "ep_" + secrets.token_hex(10)


def shown_secret(prefix: str) -> str:
    """A secret as every listing shows it: its prefix and an ellipsis."""
    return f"{prefix}…"


class WebhookEndpoints:
    """The webhook tables of one schema."""

    def __init__(self, schema: str) -> None:
        q = quote_ident(schema)
        self._endpoints = f"{q}.webhook_endpoints"
        self._secrets = f"{q}.webhook_secrets"

    async def add(
        self,
        conn: DbConnection,
        *,
        tenant: str,
        url: str,
        event_types: Sequence[str],
        box: SecretBox,
    ) -> tuple[WebhookEndpoint, str]:
        """A new endpoint and its first secret; the secret is returned here, and never again."""
        endpoint_id, secret = new_endpoint_id(), new_secret()
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {self._endpoints} (id, tenant, url, event_types)"
                " VALUES ($1, $2, $3, $4)",
                endpoint_id,
                tenant,
                url,
                sorted(set(event_types)),
            )
            await self._add_secret(conn, endpoint_id, secret, box)
        [endpoint] = await self.endpoints(conn, endpoint_id=endpoint_id)
        return endpoint, secret

    async def _add_secret(
        self, conn: DbConnection, endpoint_id: str, secret: str, box: SecretBox
    ) -> None:
        await conn.execute(
            f"INSERT INTO {self._secrets} (endpoint_id, prefix, ciphertext) VALUES ($1, $2, $3)",
            endpoint_id,
            secret[:SHOWN_CHARS],
            box.encrypt(secret.encode()),
        )

    async def endpoints(
        self, conn: DbConnection, *, tenant: str | None = None, endpoint_id: str | None = None
    ) -> list[WebhookEndpoint]:
        """Every endpoint (of `tenant`, or the one `endpoint_id`), with its live secrets'
        prefixes; by tenant, then age."""
        rows = await conn.fetch(
            "SELECT e.id, e.tenant, e.url, e.event_types, e.created_at, e.disabled_at,"
            " e.disabled_reason, coalesce(array_agg(s.prefix ORDER BY s.created_at DESC, s.id DESC)"
            "  FILTER (WHERE s.id IS NOT NULL), '{}') AS prefixes,"
            " coalesce(array_agg(s.created_at ORDER BY s.created_at DESC, s.id DESC)"
            "  FILTER (WHERE s.id IS NOT NULL), '{}') AS made,"
            " coalesce(array_agg(s.expires_at ORDER BY s.created_at DESC, s.id DESC)"
            "  FILTER (WHERE s.id IS NOT NULL), '{}') AS expiring"
            f" FROM {self._endpoints} e LEFT JOIN {self._secrets} s ON s.endpoint_id = e.id"
            "  AND (s.expires_at IS NULL OR s.expires_at > now())"
            " WHERE ($1::text IS NULL OR e.tenant = $1) AND ($2::text IS NULL OR e.id = $2)"
            " GROUP BY e.id ORDER BY e.tenant, e.created_at, e.id",
            tenant,
            endpoint_id,
        )
        return [
            WebhookEndpoint(
                id=r["id"],
                tenant=r["tenant"],
                url=r["url"],
                event_types=tuple(r["event_types"]),
                created_at=r["created_at"],
                disabled_at=r["disabled_at"],
                disabled_reason=r["disabled_reason"],
                secrets=tuple(
                    SecretView(prefix=p, created_at=c, expires_at=x)
                    for p, c, x in zip(r["prefixes"], r["made"], r["expiring"], strict=True)
                ),
            )
            for r in rows
        ]

    async def rotate(
        self,
        conn: DbConnection,
        endpoint_id: str,
        *,
        overlap: timedelta,
        box: SecretBox,
        tenant: str | None = None,
    ) -> str | None:
        """A new secret for the endpoint (returned here, never again); the live ones
        expire `overlap` from now (or sooner, if they were to already). None: no such
        endpoint. Secrets expired before now are deleted."""
        secret = new_secret()
        async with conn.transaction():
            found = await conn.fetchval(
                f"SELECT id FROM {self._endpoints} WHERE id = $1 AND {_OF_TENANT} FOR UPDATE",
                endpoint_id,
                tenant,
            )
            if found is None:
                return None
            await conn.execute(
                f"DELETE FROM {self._secrets} WHERE endpoint_id = $1 AND expires_at <= now()",
                endpoint_id,
            )
            await conn.execute(
                f"UPDATE {self._secrets} SET expires_at ="
                " least(coalesce(expires_at, 'infinity'), now() + $2::interval)"
                " WHERE endpoint_id = $1",
                endpoint_id,
                overlap,
            )
            await self._add_secret(conn, endpoint_id, secret, box)
        return secret

    async def disable(
        self, conn: DbConnection, endpoint_id: str, *, reason: str, tenant: str | None = None
    ) -> bool:
        """Disable an enabled endpoint; False if there is none enabled by that id."""
        status = await conn.execute(
            f"UPDATE {self._endpoints} SET disabled_at = now(), disabled_reason = $3"
            f" WHERE id = $1 AND {_OF_TENANT} AND disabled_at IS NULL",
            endpoint_id,
            tenant,
            reason,
        )
        return status != "UPDATE 0"

    async def enable(
        self, conn: DbConnection, endpoint_id: str, *, tenant: str | None = None
    ) -> bool:
        """Enable a disabled endpoint; False if there is none disabled by that id."""
        status = await conn.execute(
            f"UPDATE {self._endpoints} SET disabled_at = NULL, disabled_reason = NULL"
            f" WHERE id = $1 AND {_OF_TENANT} AND disabled_at IS NOT NULL",
            endpoint_id,
            tenant,
        )
        return status != "UPDATE 0"

    async def remove(
        self, conn: DbConnection, endpoint_id: str, *, tenant: str | None = None
    ) -> bool:
        """Delete an endpoint and its secrets; False if there is none by that id."""
        status = await conn.execute(
            f"DELETE FROM {self._endpoints} WHERE id = $1 AND {_OF_TENANT}", endpoint_id, tenant
        )
        return status != "DELETE 0"

    async def subscriptions(self, conn: DbConnection, tenants: Sequence[str]) -> list[Subscription]:
        """The enabled endpoints of these tenants, oldest first: one statement."""
        rows = await conn.fetch(
            f"SELECT tenant, id, event_types FROM {self._endpoints}"
            " WHERE tenant = ANY($1::text[]) AND disabled_at IS NULL"
            " ORDER BY tenant, created_at, id",
            sorted(set(tenants)),
        )
        return [
            Subscription(tenant=r["tenant"], id=r["id"], event_types=tuple(r["event_types"]))
            for r in rows
        ]

    async def signing(
        self, conn: DbConnection, endpoint_id: str, box: SecretBox
    ) -> SigningEndpoint | None:
        """The endpoint's URL and live secrets, decrypted, newest first; None if removed."""
        rows = await conn.fetch(
            "SELECT e.tenant, e.url, e.disabled_reason, s.ciphertext"
            f" FROM {self._endpoints} e LEFT JOIN {self._secrets} s ON s.endpoint_id = e.id"
            "  AND (s.expires_at IS NULL OR s.expires_at > now())"
            " WHERE e.id = $1 ORDER BY s.created_at DESC, s.id DESC",
            endpoint_id,
        )
        if not rows:
            return None
        first = rows[0]
        return SigningEndpoint(
            id=endpoint_id,
            tenant=first["tenant"],
            url=first["url"],
            disabled_reason=first["disabled_reason"],
            secrets=tuple(
                box.decrypt(r["ciphertext"]).decode() for r in rows if r["ciphertext"] is not None
            ),
        )
