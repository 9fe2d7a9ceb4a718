"""One e-mail to one recipient, and the MIME message it becomes (the stdlib's `email`).

An e-mail job names many recipients; each is one effect with a Message-ID of its
own (`<{effect_id}@{domain}>`, the same on every attempt), so a receiver that
dedupes by Message-ID drops a resend. The message is built by
`email.message.EmailMessage`, never by hand: text, HTML, or both as
multipart/alternative; headers encoded as RFC 2047 needs.

What a value may hold is checked here, so the job's door, the worker and the
sender refuse the same things:

- an address (`to`) is one addr-spec (`name@example.com`) of ASCII characters (an
  internationalized domain in its `xn--` form), at most 254 characters, parsed by
  `email.headerregistry.Address` and equal to what it parsed (no comment, no
  display name, no list);
- a mailbox (`sender`, `reply_to`) is an addr-spec or `Display Name <addr-spec>`;
- an extra header has a name of printable ASCII without `:`, is not one the message
  sets itself (From, To, Subject, Message-ID, ...), and no CR or LF is in its
  name or value (no header injection).
"""

from __future__ import annotations

import email.policy
import email.utils
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.headerregistry import Address
from email.message import EmailMessage
from types import MappingProxyType

MAX_ADDRESS_CHARS = 254  # RFC 5321's path of 256, less its angle brackets
MAX_LOCAL_PART_CHARS = 64
MAX_HEADER_VALUE_CHARS = 998  # RFC 5322's line, before folding
# Headers the message sets itself, and those that would name other recipients
# (one effect is one recipient: Cc and Bcc would be a second, unrecorded one).
RESERVED_HEADERS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "subject",
        "reply-to",
        "message-id",
        "date",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "sender",
        "return-path",
    }
)
_HEADER_NAME = re.compile(r"[!-9;-~]+")  # RFC 5322 ftext: printable ASCII but ':'
_LINE_BREAK = re.compile(r"[\r\n]")
# Built at 7 bits: non-ASCII text goes quoted-printable or base64, so a server
# without 8BITMIME takes it; SMTP's CRLF line ends.
POLICY = email.policy.SMTP.clone(cte_type="7bit")


def address_problem(value: object) -> str | None:
    """Why `value` is not one e-mail address (an addr-spec), or None."""
    if not isinstance(value, str) or not value:
        return "an e-mail address (a non-empty string)"
    if _LINE_BREAK.search(value) or "\x00" in value:
        return "an e-mail address without CR, LF or NUL"
    if len(value) > MAX_ADDRESS_CHARS:
        return f"an e-mail address of at most {MAX_ADDRESS_CHARS} characters"
    if not value.isascii():
        return "an e-mail address of ASCII characters (an internationalized domain as xn--)"
    try:
        parsed = Address(addr_spec=value)
    except Exception:  # the parser raises ValueError, IndexError, HeaderParseError...
        return "an e-mail address such as name@example.com"
    if parsed.addr_spec != value or not parsed.username or not parsed.domain:
        return "one e-mail address such as name@example.com (no name, comment or list)"
    if len(parsed.username) > MAX_LOCAL_PART_CHARS:
        return f"an e-mail address whose part before @ has at most {MAX_LOCAL_PART_CHARS} chars"
    return None


def normal_address(value: str) -> str:
    """An address with its domain lower-cased (the part before @ is the mailbox's own)."""
    mailbox, _, domain = value.rpartition("@")
    return f"{mailbox}@{domain.lower()}"


def mailbox_problem(value: object) -> str | None:
    """Why `value` is not one mailbox (`name@example.com` or `Shop <shop@example.com>`)."""
    if not isinstance(value, str) or not value:
        return "a mailbox (a non-empty string)"
    if _LINE_BREAK.search(value) or "\x00" in value:
        return "a mailbox without CR, LF or NUL"
    if address_problem(value) is None:
        return None
    try:
        header = POLICY.header_factory("from", value)
        addresses = header.addresses  # an AddressHeader
    except Exception:
        return "a mailbox such as Shop <shop@example.com>"
    if header.defects or len(addresses) != 1:
        return "one mailbox such as Shop <shop@example.com>"
    problem = address_problem(addresses[0].addr_spec)
    return None if problem is None else f"a mailbox whose address is {problem}"


def header_problem(name: object, value: object) -> str | None:
    """Why (`name`, `value`) cannot be an extra header of the message, or None."""
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        return "a header name of printable ASCII without ':'"
    if name.lower() in RESERVED_HEADERS:
        return f"{name} is set by the message itself"
    if not isinstance(value, str):
        return "a string"
    if _LINE_BREAK.search(value) or "\x00" in value:
        return "no CR, LF or NUL (a header cannot be injected)"
    if len(value) > MAX_HEADER_VALUE_CHARS:
        return f"at most {MAX_HEADER_VALUE_CHARS} characters"
    return None


class InvalidEmail(ValueError):
    """An `Email` that cannot be sent as given; the message says which field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Email:
    """One e-mail to one recipient.

    `to`: one address; `sender`: the From mailbox (None: the sender's default);
    `text`, `html`: at least one (both: multipart/alternative); `headers`: extra
    headers (see the module docstring for what each may hold)."""

    to: str
    subject: str
    text: str | None = None
    html: str | None = None
    sender: str | None = None
    reply_to: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        problem = email_problem(self)
        if problem is not None:
            raise InvalidEmail(problem)

    def message(self, *, message_id: str, default_sender: str) -> EmailMessage:
        """The MIME message, `message_id` its Message-ID (with its angle brackets)."""
        message = EmailMessage(policy=POLICY)
        message["From"] = self.sender or default_sender
        message["To"] = self.to
        message["Subject"] = self.subject
        message["Date"] = email.utils.formatdate(localtime=False, usegmt=True)
        message["Message-ID"] = message_id
        if self.reply_to is not None:
            message["Reply-To"] = self.reply_to
        for name, value in self.headers.items():
            message[name] = value
        if self.text is not None:
            message.set_content(self.text)
            if self.html is not None:
                message.add_alternative(self.html, subtype="html")
        else:
            assert self.html is not None
            message.set_content(self.html, subtype="html")
        return message


def email_problem(value: Email) -> str | None:
    """Why `value` cannot be sent (the field and what it must be), or None."""
    if (problem := address_problem(value.to)) is not None:
        return f"to: {problem}"
    if not isinstance(value.subject, str) or _LINE_BREAK.search(value.subject):
        return "subject: a string on one line (no CR or LF)"
    if value.text is None and value.html is None:
        return "text or html: at least one"
    for name, mailbox in (("sender", value.sender), ("reply_to", value.reply_to)):
        if mailbox is not None and (problem := mailbox_problem(mailbox)) is not None:
            return f"{name}: {problem}"
    for header, text in value.headers.items():
        if (problem := header_problem(header, text)) is not None:
            return f"headers.{header}: {problem}"
    return None


def envelope_sender(mailbox: str) -> str:
    """The addr-spec of a valid mailbox: what SMTP's MAIL FROM carries."""
    if address_problem(mailbox) is None:
        return mailbox
    header = POLICY.header_factory("from", mailbox)
    address: str = header.addresses[0].addr_spec
    return address
