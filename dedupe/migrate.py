"""Versioned SQL migrations, applied once however many workers start at once.

Files in `dedupe/migrations/` are named `NNNN_name.sql` and applied in order,
each in its own transaction, inside the target schema. A session-level
advisory lock serialises concurrent `migrate` calls: the second caller waits,
then finds every version already recorded and applies nothing.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from importlib import resources

import asyncpg
import structlog

from dedupe.connection import DbConnection
from dedupe.errors import MigrationError, SchemaMissing

log = structlog.get_logger(__name__)

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    """The migrations shipped with the package, in version order."""
    found = []
    for entry in resources.files("dedupe").joinpath("migrations").iterdir():
        match = _FILE.match(entry.name)
        if match is None:
            continue
        found.append(Migration(version=int(match[1]), name=match[2], sql=entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version: {versions}")
    return found


def quote_ident(name: str) -> str:
    """Quote an SQL identifier (a schema name from configuration)."""
    return '"' + name.replace('"', '""') + '"'


def _lock_key(schema: str) -> int:
    # A stable 63-bit key per schema, so two schemas migrate independently.
    return zlib.crc32(f"idempotent-workers:{schema}".encode()) | (0x1D3 << 32)


async def migrate(
    conn: DbConnection, schema: str = "public", *, upto: int | None = None
) -> list[int]:
    """Apply the pending migrations in `schema` (those up to version `upto`, if given);
    return the versions applied."""
    q = quote_ident(schema)
    applied: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _lock_key(schema))
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {q}.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {
            r["version"] for r in await conn.fetch(f"SELECT version FROM {q}.schema_migrations")
        }
        for migration in available_migrations():
            if migration.version in done or (upto is not None and migration.version > upto):
                continue
            async with conn.transaction():
                await conn.execute(f"SET LOCAL search_path TO {q}")
                try:
                    await conn.execute(migration.sql)
                except asyncpg.PostgresError as exc:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                    ) from exc
                await conn.execute(
                    f"INSERT INTO {q}.schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            applied.append(migration.version)
            log.info(
                "migration_applied", schema=schema, version=migration.version, name=migration.name
            )
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _lock_key(schema))
    return applied


async def check_schema(conn: DbConnection, schema: str = "public") -> None:
    """Raise `SchemaMissing` unless every shipped migration is applied."""
    q = quote_ident(schema)
    try:
        rows = await conn.fetch(f"SELECT version FROM {q}.schema_migrations")
    except asyncpg.UndefinedTableError as exc:
        raise SchemaMissing(
            f"no dedupe tables in schema {schema!r}: run `idempotent-workers migrate`"
        ) from exc
    missing = {m.version for m in available_migrations()} - {r["version"] for r in rows}
    if missing:
        raise SchemaMissing(
            f"schema {schema!r} lacks migrations {sorted(missing)}:"
            " run `idempotent-workers migrate`"
        )
