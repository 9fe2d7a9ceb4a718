"""What a dry run of `dlq replay` foretells of each copy it would republish.

The worker's own steps decide, in the worker's order, so a dry run and the
worker cannot disagree; nothing here restates a decode rule:

1. the copy a replay would publish, decoded by the worker's `decode`
   (`consumers.message.envelope`) with the worker's IW_MAX_BODY_BYTES:
   bad input                                                    dead-lettered again, with
                                                                its reason (invalid_json...)
2. a letter dead-lettered as invalid_push_job (so by a push       dead-lettered again as
   queue's worker) whose body `parse_push_job` still refuses     invalid_push_job: the parser's
                                                                message says why
3. its key claimed (`Claims`) with this body's fingerprint       a duplicate: a no-op
   its key claimed with another fingerprint                      dead-lettered again as
                                                                message_id_reused
4. otherwise                                                     run

`decoded()` is steps 1 and 2, `judged()` 3 and 4: `replay()` decodes every
copy first, then reads the claims of the keys that decode in one query (a
key that does not decode, NUL in it say, was never claimed).

Without the app, the default fingerprint stands in for a consumer's own
(`fingerprint=`), and no other push job than one dead-lettered as
invalid_push_job is parsed; the notes say so where it matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from consumers.message.envelope import BadInput, Envelope, Incoming, decode
from consumers.message.verdict import REUSED
from consumers.push.job import INVALID_PUSH_JOB, InvalidPushJob, parse_push_job
from dedupe import ClaimRow


class Fate(StrEnum):
    """What the worker would do with a replayed copy."""

    RUN = "run"
    DUPLICATE = "duplicate"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True, kw_only=True)
class Foretold:
    fate: Fate
    reason: str = ""  # with DEAD_LETTER: the reason it would be dead-lettered with again
    why: str = ""


def decoded(
    copy: Incoming, *, consumer: str, dead_lettered_as: str, max_body_bytes: int
) -> Envelope | Foretold:
    """Steps 1 and 2 for `copy` of a letter dead-lettered as `dead_lettered_as`: its
    envelope, whose key the claims decide, or the reason it would be dead-lettered again."""
    envelope = decode(copy, consumer=consumer, max_body_bytes=max_body_bytes)  # 1.
    if isinstance(envelope, BadInput):
        return Foretold(
            fate=Fate.DEAD_LETTER,
            reason=str(envelope),
            why="the worker's decode refuses it as it stands",
        )
    if dead_lettered_as == INVALID_PUSH_JOB:  # 2.
        try:
            parse_push_job(envelope.body)
        except InvalidPushJob as exc:
            return Foretold(fate=Fate.DEAD_LETTER, reason=INVALID_PUSH_JOB, why=str(exc))
    return envelope


def judged(envelope: Envelope, claim: ClaimRow | None) -> Foretold:
    """Steps 3 and 4: what the claim of the envelope's key (None: no claim) makes of it."""
    if claim is None:  # 4.
        return Foretold(fate=Fate.RUN)
    when = claim.processed_at.isoformat(timespec="seconds")  # 3.
    if claim.fingerprint == envelope.fingerprint:
        return Foretold(
            fate=Fate.DUPLICATE, why=f"already processed at {when}: a replay would be a no-op"
        )
    return Foretold(
        fate=Fate.DEAD_LETTER,
        reason=REUSED.reason,
        why=(
            f"claimed at {when} for another body, unless the consumer's own fingerprint"
            " ignores the difference"
        ),
    )
