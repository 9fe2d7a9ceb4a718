"""What a dry run of `dlq replay` foretells of each copy it would republish.

The worker's own steps decide, in the worker's order, so a dry run and the
worker cannot disagree; nothing here restates a decode rule:

1. the copy a replay would publish (`consumers.commands.copies`), decoded
   by the worker's `decode` (`consumers.message.envelope`), IW_MAX_BODY_BYTES:
   bad input                                                    dead-lettered again, with
                                                                its reason (invalid_json...)
2. a letter dead-lettered as invalid_<kind>_job (so by the      dead-lettered again as
   worker of a queue of that kind of effect) whose body the     invalid_<kind>_job: the parser's
   kind's own `parse` still refuses                             message says why
3. its key claimed (`Claims`) with this body's fingerprint       a duplicate: a no-op
   its key claimed with another fingerprint                      dead-lettered again as
                                                                message_id_reused
4. otherwise                                                     run

`decoded()` is steps 1 and 2, `judged()` 3 and 4: `replay()` decodes every
copy first, then reads the claims of the keys that decode in one query (a
key that does not decode, NUL in it say, was never claimed).

Without the app, the default fingerprint stands in for a consumer's own
(`fingerprint=`), a job is parsed again only when it was dead-lettered as
invalid_<kind>_job, and only by a kind the framework ships (push): an app's
own kinds (webhook, e-mail...) are known to its workers alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from consumers.jobs.kind import InvalidJob, invalid_job_reason
from consumers.jobs.push import PUSH
from consumers.message.envelope import BadInput, Envelope, Incoming, decode
from consumers.message.verdict import REUSED
from dedupe import ClaimRow

# The kinds of effect the framework ships, by the reason a job of theirs that
# does not parse is dead-lettered with.
PARSERS = {invalid_job_reason(kind.name): kind for kind in (PUSH,)}


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
    kind = PARSERS.get(dead_lettered_as)  # 2.
    if kind is not None:
        try:
            kind.parse(envelope.body)
        except InvalidJob as exc:
            return Foretold(fate=Fate.DEAD_LETTER, reason=dead_lettered_as, why=str(exc))
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
