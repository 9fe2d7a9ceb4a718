"""One send, any number of devices: a push job of up to MAX_AUDIENCE devices in parts.

One AMQP message carries at most MAX_TARGETS devices and MAX_JOB_BYTES, so a
send to more is published as parts, each an ordinary push job of at most
PART_TARGETS devices (200: even at 4,096-character tokens a part stays under
1 MiB) whose message_id derives from the send's: `parent#0`, `parent#1`, ...
(`dedupe.part_message_ids`). The split is a function of the body alone: a
publish retried with the same message_id yields the same parts, and each part's
claim dedupes it like any job, so every device gets one push however often the
send is published. A send that fits one part keeps its own message_id.

    await publish_push_job(publisher, "notifications.push", body, message_id="blast-7")

The parts of a send of more than one part go to the queue's bulk lane
(`bulk_lane(queue)`, `<queue>.bulk`), which every worker of the queue
consumes beside it with a prefetch of about what it holds: the parts wait in
the broker until a worker has room, so a worker started while a send is under
way takes its share, and one-part jobs never queue behind a large send's parts.
A worker holds only the parts it has been delivered, each leased in chunks
(`consumers.effects.sending`): memory follows the chunk, not the send. The send
API splits the same way (`ingress`), and its message status counts the devices
of every part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from consumers.handlers.retry import bulk_lane
from consumers.jobs.push import MAX_AUDIENCE, InvalidPushJob, parse_push_job, target_json
from consumers.publishing.publisher import Publisher
from dedupe import PART_TARGETS, part_message_ids

MAX_MESSAGE_ID_BYTES = 128
PART_SUFFIX_BYTES = len(f"#{MAX_AUDIENCE // PART_TARGETS}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPart:
    """One part of a send: an ordinary push job and its derived message_id."""

    message_id: str
    body: Mapping[str, Any]


def push_job_parts(
    message_id: str, body: Mapping[str, Any], *, allow_hosts: Set[str] = frozenset()
) -> list[JobPart]:
    """The parts of a send of up to MAX_AUDIENCE devices, in target order.

    Raises `InvalidPushJob` for a body no worker would attempt, or a message_id
    with no room left for a part's suffix. `allow_hosts`: as `parse_push_job`'s."""
    # repeated devices fold here
    job = parse_push_job(body, max_targets=MAX_AUDIENCE, allow_hosts=allow_hosts)
    ids = part_message_ids(message_id, len(job.targets))
    if len(ids) == 1:
        return [JobPart(message_id=message_id, body=body)]
    if len(message_id.encode()) + PART_SUFFIX_BYTES > MAX_MESSAGE_ID_BYTES:
        raise InvalidPushJob(
            f"message_id: at most {MAX_MESSAGE_ID_BYTES - PART_SUFFIX_BYTES} bytes"
            f" for a send to more than {PART_TARGETS} devices"
        )
    rest = {name: value for name, value in body.items() if name != "targets"}
    targets = [target_json(t) for t in job.targets]
    return [
        JobPart(
            message_id=part_id,
            body={**rest, "targets": targets[k * PART_TARGETS : (k + 1) * PART_TARGETS]},
        )
        for k, part_id in enumerate(ids)
    ]


async def publish_push_job(
    publisher: Publisher,
    queue: str,
    body: Mapping[str, Any],
    *,
    message_id: str,
    tenant: str = "",
    allow_hosts: Set[str] = frozenset(),
) -> int:
    """Publish a send of up to MAX_AUDIENCE devices as its parts (to the bulk lane when
    there are several); return how many.

    Returns once the broker confirmed every part; raises the first PublisherError
    otherwise (publish again with the same message_id: the parts are the same)."""
    parts = push_job_parts(message_id, body, allow_hosts=allow_hosts)
    lane = queue if len(parts) == 1 else bulk_lane(queue)
    await asyncio.gather(
        *(
            publisher.publish(lane, part.body, message_id=part.message_id, tenant=tenant)
            for part in parts
        )
    )
    return len(parts)
