"""Every queue a worker needs, checked against what the broker holds, before any is declared.

A queue that exists with other arguments than ours (a classic queue a
publisher declared the tutorial way, a quorum queue without our dead-letter
arguments, a retry tier with another TTL) makes the broker refuse our declare
with PRECONDITION_FAILED. That is a configuration error, not a failure a
restart cures, and found halfway through the declares it would leave the
queues declared before it behind. So `check()`, on a channel of its own:

1. declares each queue passively, in the order `topology.declare` makes them:
   NOT_FOUND means we will create it (the channel is reopened), nothing to
   compare;
2. declares an existing one again with our arguments: an equivalent declare
   changes nothing; PRECONDITION_FAILED names the first argument that
   differs and what the queue holds (`current is none`, `current is '999'`);
3. takes what the queue holds for that argument and asks again, until the
   broker agrees: the queue differs from ours in exactly the arguments
   adopted (the broker tells no more than this; AMQP has no way to read a
   queue's arguments). A refusal it cannot read stops there, told as is;
4. raises `TopologyConflict` for the first queue that differs, before
   `declare` has made anything.

The queue a step 2 or 3 declare names exists already (step 1 saw it): should
it be deleted in between, that declare creates it, with the arguments asked.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aio_pika
import aiormq

from consumers.broker.connection import connect_once
from consumers.message.decisions import ConfigurationError

MAX_PROBES = 16  # declares per existing queue: one per argument we set, and more than enough
STOPPED_CHECK_S = 5.0  # a check whose connection was closed under it ends by then, or is cancelled
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for queue .*: received .* but current is"
    r" (?:none|the value '(?P<typed>.*)' of type '(?P<type>[^']+)'|'(?P<plain>.*)')$"
)
_INTEGER_TYPES = {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort"}


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDeclaration:
    """One queue as the worker declares it."""

    name: str
    arguments: Mapping[str, Any]
    durable: bool = True


class TopologyConflict(ConfigurationError):
    """A queue the worker needs exists with other arguments: nothing was declared.

    `declared` is what we declare, `refused` the broker's first refusal,
    `existing` what the queue holds for each argument that differs (None:
    the queue lacks it), as far as the broker told.
    """

    def __init__(
        self, declaration: QueueDeclaration, refused: str, existing: Mapping[str, Any]
    ) -> None:
        super().__init__(f"queue {declaration.name!r} exists with other arguments: {refused}")
        self.queue = declaration.name
        self.declared = {"durable": declaration.durable, **declaration.arguments}
        self.refused = refused
        self.existing = dict(existing)


async def check_broker(urls: Sequence[str], declarations: Sequence[QueueDeclaration]) -> None:
    """`check()` on a plain connection of its own, closed after.

    Plain, not robust: a channel the broker closes (NOT_FOUND,
    PRECONDITION_FAILED) stays closed, where a robust one would be reopened in
    the background and kept open for as long as the worker runs.

    A cancel (SIGTERM while the worker starts) closes the connection first,
    then ends the check: aiormq answers a cancelled call by closing its
    channel, and when the call was a declare the broker refuses, the broker
    has closed that channel already and takes the second close for a frame on
    a closed channel, closing the whole connection with CHANNEL_ERROR (and
    aiormq logs a traceback). A connection closed under the call ends it
    with no channel close.
    """
    connection = await connect_once(urls)
    checking = asyncio.ensure_future(check(connection, declarations))
    try:
        await asyncio.shield(checking)
    except asyncio.CancelledError:
        await connection.close()
        # Its calls fail with the connection, so it ends within a turn or two of the loop.
        await asyncio.wait([checking], timeout=STOPPED_CHECK_S)
        if not checking.done():
            checking.cancel()
        elif not checking.cancelled():
            checking.exception()  # retrieved: a stopped check's outcome is not news
        raise
    finally:
        await connection.close()


async def check(
    connection: aio_pika.abc.AbstractConnection, declarations: Sequence[QueueDeclaration]
) -> None:
    """Raise TopologyConflict for the first queue of `declarations` that exists otherwise."""
    channel = await connection.channel()
    try:
        for declaration in declarations:
            channel, found = await _exists(connection, channel, declaration.name)
            if found:
                channel = await _compare(connection, channel, declaration)
    finally:
        if not channel.is_closed:
            await channel.close()


async def _exists(
    connection: aio_pika.abc.AbstractConnection, channel: aio_pika.abc.AbstractChannel, name: str
) -> tuple[aio_pika.abc.AbstractChannel, bool]:
    try:
        await channel.declare_queue(name, passive=True)
    except aio_pika.exceptions.ChannelNotFoundEntity:
        return await connection.channel(), False  # the broker closed that channel
    return channel, True


async def _compare(
    connection: aio_pika.abc.AbstractConnection,
    channel: aio_pika.abc.AbstractChannel,
    declaration: QueueDeclaration,
) -> aio_pika.abc.AbstractChannel:
    """Steps 2 and 3: the channel to go on with, or TopologyConflict."""
    asked = declaration
    existing: dict[str, Any] = {}
    first: str | None = None
    for _ in range(MAX_PROBES):
        try:
            await channel.declare_queue(
                asked.name, durable=asked.durable, arguments=dict(asked.arguments)
            )
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            channel = await connection.channel()
            refused = _reply_text(exc)
            first = first or refused
            learned = _learn(asked, refused)
            if learned is None:
                break
            asked, (argument, value) = learned
            existing[argument] = value
            continue
        if first is None:
            return channel  # equivalent: nothing to say
        break
    assert first is not None
    await channel.close()
    raise TopologyConflict(declaration, first, existing)


def _reply_text(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else str(exc)


def _learn(
    asked: QueueDeclaration, refused: str
) -> tuple[QueueDeclaration, tuple[str, Any]] | None:
    """`asked` with the refused argument set to what the queue holds, and that value."""
    found = _INEQUIVALENT.search(refused)
    if found is None:
        return None
    argument = found["arg"]
    if argument == "durable":
        current = found["plain"] == "true"
        return replace(asked, durable=current), ("durable", current)
    held = found["typed"] if found["typed"] is not None else found["plain"]
    arguments = dict(asked.arguments)
    if held is None:  # `current is none`: the queue lacks it
        if argument not in arguments:
            return None  # nothing left to adopt: the broker would say the same again
        del arguments[argument]
        return replace(asked, arguments=arguments), (argument, None)
    value: Any = held
    if found["type"] in _INTEGER_TYPES or (found["type"] is None and held.lstrip("-").isdigit()):
        value = int(held)
    if arguments.get(argument) == value:
        return None
    arguments[argument] = value
    return replace(asked, arguments=arguments), (argument, value)
