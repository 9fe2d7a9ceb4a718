"""`idempotent-workers webhook endpoint add|list|rotate|disable|enable|remove`: the
tenants' webhook endpoints and their signing secrets.

A secret is printed whole once, by the command that makes it (`add`, `rotate`), on
stdout and nowhere else: it is stored encrypted under IW_WEBHOOK_SECRETS_KEY, which
those two commands need (they refuse to run without it, exit 78). Every other
command, and every listing, shows only a secret's first characters. An endpoint's
URL is https, or http to a host of IW_WEBHOOK_ALLOW_HTTP_HOSTS.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

import asyncpg

from consumers.commands.printable import printable
from consumers.jobs.webhook import is_event_type
from consumers.jobs.webhook_endpoints import secret_box, url_problem
from consumers.message.decisions import ConfigurationError
from consumers.settings import Settings
from dedupe import WebhookEndpoint, WebhookEndpoints, shown_secret

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: the key is missing or malformed


def register(sub: Any) -> None:
    """Add `webhook endpoint ...` to the CLI's subcommands."""
    webhook = sub.add_parser(
        "webhook",
        help="webhook endpoints and their signing secrets: add, list, rotate, disable...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = webhook.add_subparsers(
        dest="webhook_command",
        required=True,
        metavar="endpoint",
        help="endpoint --help: its actions",
    )
    endpoint = kinds.add_parser(
        "endpoint",
        help="add, list, rotate, disable, enable or remove a tenant's endpoint",
        description="A tenant's webhook endpoints: where its webhook jobs are sent.",
    )
    actions = endpoint.add_subparsers(
        dest="endpoint_command", required=True, help="ACTION --help: its flags"
    )
    add = actions.add_parser(
        "add",
        help="add an endpoint; prints its id and its signing secret, once",
        description="Add an endpoint for TENANT's webhooks and make its first signing"
        " secret, printed once: give it to the receiver now (it verifies every call"
        " with it); afterwards only its prefix is shown. Needs IW_WEBHOOK_SECRETS_KEY.",
    )
    add.add_argument("--tenant", required=True, help="the tenant whose jobs it receives")
    add.add_argument(
        "--url",
        required=True,
        help="where calls are POSTed: https (http only to IW_WEBHOOK_ALLOW_HTTP_HOSTS);"
        " its final URL, redirects are not followed",
    )
    add.add_argument(
        "--event-type",
        action="append",
        default=[],
        dest="event_types",
        metavar="TYPE",
        help="an event type it takes (repeat for more); none: every event type",
    )
    listing = actions.add_parser(
        "list",
        help="list endpoints with their secrets' prefixes",
        description="List the endpoints (of one tenant, or all): id, tenant, URL, event"
        " types, state, and each live secret's prefix and expiry. Never a whole secret.",
    )
    listing.add_argument("--tenant", help="only this tenant's")
    rotate = actions.add_parser(
        "rotate",
        help="make a new signing secret; prints it once; the old one signs beside it a while",
        description="Make a new signing secret for the endpoint, printed once. Calls are"
        " signed by the old and the new secret side by side for --overlap-hours, so the"
        " receiver can switch to the new one without a failed call; then by the new one"
        " alone. Needs IW_WEBHOOK_SECRETS_KEY.",
    )
    rotate.add_argument("id", help="the endpoint's id (ep_...)")
    rotate.add_argument(
        "--overlap-hours",
        type=float,
        default=None,
        metavar="H",
        help="how long the old secret still signs (default IW_WEBHOOK_ROTATION_OVERLAP_HOURS,"
        " 24); 0: from now on the new one alone",
    )
    for name, text in (
        ("disable", "stop sending to the endpoint (its pending calls fail, new jobs skip it)"),
        ("enable", "send to a disabled endpoint again (a 410 Gone disables it too)"),
        ("remove", "delete the endpoint and its secrets"),
    ):
        action = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        action.add_argument("id", help="the endpoint's id (ep_...)")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    command: str = args.endpoint_command
    store = WebhookEndpoints(settings.database.schema)
    webhooks = settings.webhooks
    try:
        box = secret_box(webhooks.secrets_keys) if command in ("add", "rotate") else None
    except ConfigurationError as exc:
        print(f"idempotent-workers: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if command == "add":
        problem = url_problem(args.url, webhooks.allow_http_hosts)
        bad_type = next((t for t in args.event_types if not is_event_type(t)), None)
        if problem is not None or bad_type is not None:
            why = f"--url: {problem}" if problem else f"--event-type {printable(bad_type or '')}"
            print(f"idempotent-workers: {why}", file=sys.stderr)
            return EXIT_USAGE
    conn = await asyncpg.connect(settings.database.url)
    try:
        if command == "add":
            assert box is not None
            endpoint, made = await store.add(
                conn, tenant=args.tenant, url=args.url, event_types=args.event_types, box=box
            )
            print(_line(endpoint))
            print(f"secret: {made}")
            print("  shown once: give it to the receiver now; `list` shows only its prefix")
            return 0
        if command == "list":
            for endpoint in await store.endpoints(conn, tenant=args.tenant):
                print(_line(endpoint))
            return 0
        if command == "rotate":
            assert box is not None
            hours = (
                webhooks.rotation_overlap_hours
                if args.overlap_hours is None
                else args.overlap_hours
            )
            if hours < 0:
                print("idempotent-workers: --overlap-hours: 0 or more", file=sys.stderr)
                return EXIT_USAGE
            secret = await store.rotate(conn, args.id, overlap=timedelta(hours=hours), box=box)
            if secret is None:
                return _not_found(args.id)
            print(f"endpoint: {printable(args.id)}")
            print(f"secret: {secret}")
            print(f"  shown once; the previous secret signs beside it for {hours:g} h")
            return 0
        if command == "disable":
            done = await store.disable(conn, args.id, reason="disabled by an operator")
        elif command == "enable":
            done = await store.enable(conn, args.id)
        else:
            done = await store.remove(conn, args.id)
        if not done:
            return _not_found(args.id, state=command)
        print(f"{command}d: {printable(args.id)}")
        return 0
    finally:
        await conn.close()


def _not_found(endpoint_id: str, *, state: str = "") -> int:
    which = {"disable": "enabled ", "enable": "disabled "}.get(state, "")
    print(f"idempotent-workers: no {which}endpoint {printable(endpoint_id)}", file=sys.stderr)
    return EXIT_NOT_FOUND


def _line(endpoint: WebhookEndpoint) -> str:
    """One endpoint, everything escaped; its secrets by their prefixes only."""
    state = "enabled"
    if endpoint.disabled_at is not None:
        state = f"disabled ({printable(endpoint.disabled_reason or '')})"
    types = ",".join(printable(t) for t in endpoint.event_types) or "*"
    secrets = " ".join(
        shown_secret(s.prefix)
        + (f"(expires {s.expires_at.isoformat()})" if s.expires_at is not None else "")
        for s in endpoint.secrets
    )
    return (
        f"{printable(endpoint.id)} tenant={printable(endpoint.tenant) or '(none)'}"
        f" url={printable(endpoint.url)} event_types={types} {state}"
        f" created={endpoint.created_at.isoformat()} secrets={secrets or '(none live)'}"
    )
