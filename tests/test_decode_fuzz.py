"""The decoder decides every input a publisher can send, and never raises.

Inputs are raw AMQP content headers and bodies (`proving.fuzz.inputs`),
read the way the worker reads them: pamqp unmarshals the header bytes (with
`read_leniently`), aio-pika wraps the delivery, `decode` decides. The end
to end form, through a real worker and broker, is `python -m proving.fuzz`;
`tests/test_fuzz_run.py` runs a small one.
"""

from __future__ import annotations

import struct
from typing import Any, cast

import aio_pika
from aiormq.abc import DeliveredMessage
from hypothesis import HealthCheck, given, settings
from pamqp import commands
from pamqp.header import ContentHeader

from consumers import BadInput, Envelope
from consumers.broker.headers import read_leniently, republishable_headers, republished
from consumers.message.envelope import decode, is_text
from proving.fuzz.inputs import RawInput, raw_inputs
from proving.rawamqp import encode_properties

MAX_BODY = 4096


def delivered(raw: RawInput) -> aio_pika.abc.AbstractIncomingMessage:
    """`raw` as the worker's consumer callback gets it, from the wire bytes."""
    header = ContentHeader()
    header.unmarshal(struct.pack(">HHQ", 60, 0, len(raw.body)) + encode_properties(raw.properties))
    deliver = commands.Basic.Deliver(
        consumer_tag="fuzz", delivery_tag=1, exchange="", routing_key="fuzz"
    )
    message = DeliveredMessage(
        delivery=deliver, header=header, body=raw.body, channel=cast(Any, None)
    )
    return aio_pika.IncomingMessage(message, no_ack=True)


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw_inputs())
def test_every_raw_input_is_an_envelope_or_bad_input_and_can_be_written_back(
    raw: RawInput,
) -> None:
    read_leniently()
    message = delivered(raw)
    result = decode(message, consumer="fuzz", max_body_bytes=MAX_BODY)
    assert isinstance(result, Envelope | BadInput)
    if isinstance(result, Envelope):  # what the claim writes, PostgreSQL takes
        for text in (result.tenant, result.message_id):
            assert is_text(text) and "\0" not in text
        assert len(result.message_id.encode()) <= 128
    # Whatever was decided, the message can go to a retry tier or the DLQ.
    out = republished(message, republishable_headers(message.headers or {}))
    ContentHeader(0, len(out.body), out.properties).marshal()
