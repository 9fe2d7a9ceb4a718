"""A send's body: read up to a limit, decoded once, checked by its worker's own rules.

    read_body     413 from Content-Length before a byte of the body is read;
                  a chunked body is read piece by piece and refused (413) once
                  it passes the limit, so a body is never held past it
    decode_body   UTF-8 JSON, one value for every parser: a key given twice,
                  NaN, Infinity, a number past any float, a lone surrogate,
                  an integer of thousands of digits are 400, never a 500;
                  more values than a send holds, 400 before decoding
    validated     the body's shape (`SendRequest`; a 400 lists up to
                  MAX_DETAILS wrong fields), then `consumers.jobs.push.parse_push_job`,
                  the worker's own rules (with the Web Push hosts the workers
                  allow): what the door answers 202 the worker attempts, never
                  dead-letters as invalid
    shaped, job_refused   the same two steps for any kind's model and parser

A 413 closes the connection (`Connection: close`), so the rest of an
oversized body is not read either. A client gone before its body was whole
ends the request as `CLIENT_GONE`, answered to nobody.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError

from consumers import InvalidJob, InvalidPushJob, PushJob, parse_push_job
from consumers.jobs.push import MAX_AUDIENCE, apns_payload_problem
from consumers.runtime.http_limits import BodyTooLarge, ClientGone, read_within
from ingress.models import (
    TARGET_FIELDS,
    TARGET_SHAPES,
    NotificationIn,
    SendRequest,
    SubscriptionKeys,
)
from ingress.refusals import CLIENT_GONE, Refusal, field_name, invalid

M = TypeVar("M", bound=BaseModel)


def too_large(limit: int) -> Refusal:
    return Refusal(413, {"error": "body_too_large", "max_bytes": limit}, {"Connection": "close"})


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes; 413 past it, before reading what is past."""
    try:
        return await read_within(request, limit)
    except BodyTooLarge:
        raise too_large(limit) from None
    except ClientGone:
        raise CLIENT_GONE from None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return found


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is past any float")
    return value


# A send holds at most this many JSON values: each target a token's object of two
# (three bytes among `{`, `,` and `[`) or a subscription's of four, its keys an
# object of two (seven bytes), the rest a few thousand at most (its strings hold
# no more, within APNs's payload limit). Counted from those bytes before
# decoding, whose Python objects cost tens of times the bytes: a 64 MiB body of
# zeros would be 32 million of them. A comma inside a string counts too, so the
# count is never under the truth.
MAX_JSON_VALUES = 8 * MAX_AUDIENCE + 10_000


def decode_body(content_type: str, raw: bytes) -> dict[str, Any]:
    """The body's one JSON object; 400 invalid_request when a parser could read it two
    ways, or when it holds more values than a send can (before it is decoded)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise invalid(("body", "Content-Type: application/json is required"))
    if raw.count(b",") + raw.count(b"{") + raw.count(b"[") > MAX_JSON_VALUES:
        raise invalid(("body", f"more JSON values than a send holds ({MAX_JSON_VALUES:,})"))
    try:
        value = json.loads(
            raw.decode(), object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_finite
        )
        orjson.dumps(value)  # a lone surrogate cannot be stored as UTF-8
    except (ValueError, RecursionError, orjson.JSONEncodeError) as exc:
        raise invalid(("body", f"not one JSON value: {_short(exc)}")) from None
    if not isinstance(value, dict):
        raise invalid(("body", "a JSON object is required"))
    return value


# A 400 lists at most this many problems. Each costs memory to find and to say: a
# body of unknown fields of 9 bytes each holds millions in the request limit.
MAX_DETAILS = 20
EXTRA = "Extra inputs are not permitted"  # pydantic's words, so both kinds read alike


def _open_ended(body: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The problems whose number only the body's size bounds, found without pydantic
    (which would build an error for every one): unknown fields at any level, and
    `notification.data` entries that are no text. Targets need no walk of their
    own: their field says `fail_fast` to pydantic."""
    yield from unknown_fields(body, SendRequest)
    note = body.get("notification")
    if isinstance(note, dict):
        yield from unknown_fields(note, NotificationIn, "notification.")
        data = note.get("data")
        if isinstance(data, dict):
            for key, value in data.items():
                if not isinstance(value, str) or "\x00" in value or "\x00" in key:
                    yield f"notification.data.{key}", "text without NUL is required"
    targets = body.get("targets")
    if isinstance(targets, list):
        for n, target in enumerate(targets[:MAX_AUDIENCE]):
            if isinstance(target, dict):
                for key in target:
                    if key not in TARGET_FIELDS:
                        yield f"targets.{n}.{key}", EXTRA
                keys = target.get("keys")
                if isinstance(keys, dict):
                    yield from unknown_fields(keys, SubscriptionKeys, f"targets.{n}.keys.")


def unknown_fields(
    value: dict[str, Any], model: type[BaseModel], prefix: str = ""
) -> Iterator[tuple[str, str]]:
    """A problem for each field of `value` that `model` does not have (by its JSON name)."""
    known = {field.alias or name for name, field in model.model_fields.items()}
    for key in value:
        if key not in known:
            yield f"{prefix}{key}", EXTRA


def listed(problems: Iterable[tuple[str, str]]) -> Refusal:
    """400 invalid_request with the first MAX_DETAILS problems, saying if more went unlisted."""
    first = list(itertools.islice(problems, MAX_DETAILS + 1))
    if len(first) > MAX_DETAILS:
        first[MAX_DETAILS:] = [("body", f"more problems than the {MAX_DETAILS} listed")]
    return invalid(*first)


def shaped(model: type[M], body: dict[str, Any], open_ended: Iterable[tuple[str, str]]) -> M:
    """`body` as `model`; 400 listing what is wrong, the `open_ended` problems (those a
    body can hold without bound, found by the caller) first and alone if any."""
    if found := list(itertools.islice(open_ended, MAX_DETAILS + 1)):
        raise listed(found)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise listed(
            (field_name(("body", *_untagged(e["loc"]))), e["msg"]) for e in exc.errors()
        ) from None


def _untagged(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """`loc` without the shape pydantic names after a target's index."""
    if len(loc) > 2 and loc[0] == "targets" and loc[2] in TARGET_SHAPES:
        return (*loc[:2], *loc[3:])
    return loc


def job_refused(exc: InvalidJob) -> Refusal:
    """400 naming the field a job parser refused (`targets[3].token` as `targets.3.token`)."""
    where, _, message = str(exc).partition(": ")
    return invalid((re.sub(r"\[(\d+)\]", r".\1", where), message))


@dataclass(frozen=True, slots=True, kw_only=True)
class PushSend:
    """A send the door accepts: its key from the body, if there, and the job the worker reads."""

    idempotency_key: str | None
    job: PushJob


def validated(body: dict[str, Any], *, allow_hosts: Set[str] = frozenset()) -> PushSend:
    """`body` as a push job the worker will attempt; 400 naming what is wrong (at most
    MAX_DETAILS problems, then a line saying there were more). `allow_hosts`: the Web
    Push hosts the workers allow (`IngressSettings.webpush_allow_hosts`)."""
    request = shaped(SendRequest, body, _open_ended(body))
    try:  # more than a job holds: parts
        job = parse_push_job(body, max_targets=MAX_AUDIENCE, allow_hosts=allow_hosts)
    except InvalidPushJob as exc:
        raise job_refused(exc) from None
    # Accepted, every iOS device would fail PayloadTooLarge: say so now.
    if (problem := apns_payload_problem(job)) is not None:
        raise invalid(("notification", problem))
    return PushSend(idempotency_key=request.idempotency_key, job=job)


def _short(exc: Exception) -> str:
    return str(exc).split("\n")[0][:120]
