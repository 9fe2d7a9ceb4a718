"""The last steps of every route that queues a job: its fingerprint, its rows, its answer.

    fingerprint_of(kind, body)   SHA-256 of the canonical body, the key field left
                                 out, and of its kind: a key is the tenant's across
                                 kinds, so the same key for a push and then a
                                 webhook is 422 `idempotency_key_reused`
    queue_job(...)               key row, message row and outbox row(s) through the
                                 group committer (one statement, one commit), then
                                 202 `queued`, 202 `duplicate_ignored` with the
                                 first id and `Idempotent-Replayed: true`, or 422

A push's fingerprint is its body's alone, as it was before other kinds came, so
a key stored then still answers its retries; every other kind's is that of
`{"kind": kind, "job": body}`, which no push body equals (a push body has
`targets`, which neither key is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Response

from consumers import SpanKind, bulk_lane, tracing
from dedupe import Acceptance, NewMessage, fingerprint
from ingress.openapi import REPLAYED_HEADER
from ingress.reading import Running
from ingress.refusals import json_response

PUSH = "push"


def fingerprint_of(kind: str, body: dict[str, Any]) -> bytes:
    """The fingerprint a request's key is stored with (`body`: as `decode_body` read it,
    the key field left out)."""
    if kind == PUSH:  # decode_body read it and the push model took it: no float in it
        return fingerprint(body, plain=True)
    return fingerprint({"kind": kind, "job": body})


async def queue_job(
    running: Running,
    *,
    kind: str,
    queue: str,
    tenant: str,
    key: str,
    body: dict[str, Any],
    stored: Sequence[bytes],
    targets: int,
) -> Response:
    """Commit the job (`stored`: its outbox bodies, one unless a push is sent in parts;
    `targets`: the recipients known now, 0 when the worker chooses them) and answer."""
    assert running.committer is not None
    traces = tracing()
    creating = traces.span(
        f"create {queue}",
        SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.operation.type": "create",
            "messaging.operation.name": "create",
        },
    )
    trace = traces.headers(creating)  # the outbox row keeps it; the relay's publish continues it
    try:
        answer = await running.committer.submit(
            NewMessage(
                tenant=tenant,
                idempotency_key=key,
                fingerprint=fingerprint_of(kind, body),
                queue=queue,
                targets=targets,
                job=stored[0],
                parts=tuple(stored) if len(stored) > 1 else (),
                # A send's parts: to the queue's bulk lane (docs/tenants.md).
                parts_queue=bulk_lane(queue) if len(stored) > 1 else None,
                traceparent=trace.get("traceparent"),
                tracestate=trace.get("tracestate"),
            )
        )
    finally:
        if creating is not None:
            creating.end()
    if answer.outcome is Acceptance.KEY_REUSED:
        return json_response(422, {"error": "idempotency_key_reused"})
    replayed = answer.outcome is Acceptance.DUPLICATE_IGNORED
    return json_response(
        202,
        {"status": str(answer.outcome), "id": str(answer.id)},
        {REPLAYED_HEADER: "true"} if replayed else None,
    )
