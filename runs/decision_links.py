"""The signed link of an approval's notification (`/decisions/<token>/`): it names one run, step and attempt, is
signed with Django's signing (SECRET_KEY, salt "pal.decisions"), stamped with the time the approval opened and
expires PAL_DECISION_LINK_TTL seconds later by the database's clock. One decision per attempt makes it single-use:
once that attempt is decided, the link answers 410. Only its hash is ever stored (link_hash)."""

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core import signing
from django.core.signing import b62_decode, b62_encode

from pal.clock import db_now

SALT = "pal.decisions"


class LinkInvalid(Exception):
    """A token that was not signed here (or was altered): nothing it names is read."""


class LinkExpired(Exception):
    """A token signed here whose time is over."""


@dataclass(frozen=True)
class Link:
    run_id: str
    step_id: str
    attempt: int
    opened_at: datetime


class _Stamped(signing.TimestampSigner):
    """A TimestampSigner stamped with a given time (the approval's opening, by the database's clock), so a
    notification sent again after a crash carries the same link."""

    def __init__(self, *, at: int = 0):
        super().__init__(salt=SALT)
        self.at = at

    def timestamp(self) -> str:
        return b62_encode(self.at)


def link_token(*, run_id, step_id: str, attempt: int, opened_at: datetime) -> str:
    """The token of one approval's attempt: the same for the same approval, whoever asks."""
    signer = _Stamped(at=int(opened_at.timestamp()))
    return signer.sign_object({"r": str(run_id), "s": step_id, "a": attempt}, compress=True)


def link_url(token: str) -> str:
    """The link as it goes out: PAL_SITE_URL + /decisions/<token>/."""
    return f"{settings.PAL_SITE_URL.rstrip('/')}/decisions/{token}/"


def link_hash(token: str) -> str:
    """What the journal keeps of a link that decided: its SHA-256, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def link_read(token: str) -> Link:
    """What a token names; LinkInvalid when it was not signed here, LinkExpired when its time is over (by the
    database's clock)."""
    try:
        data = signing.TimestampSigner(salt=SALT).unsign_object(token)  # no max_age: the database's clock, below
        at = b62_decode(signing.Signer(salt=SALT).unsign(token).rsplit(":", 1)[1])
    except (signing.BadSignature, ValueError, TypeError, IndexError):
        raise LinkInvalid("this link was not made here, or it was changed") from None
    if not (isinstance(data, dict) and isinstance(data.get("r"), str) and isinstance(data.get("s"), str)):
        raise LinkInvalid("this link does not name a decision")
    opened_at = datetime.fromtimestamp(at, tz=UTC)
    if db_now() > opened_at + timedelta(seconds=settings.PAL_DECISION_LINK_TTL):
        raise LinkExpired(f"this link expired {settings.PAL_DECISION_LINK_TTL:g} s after the approval opened")
    attempt = data.get("a")
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        raise LinkInvalid("this link does not name a decision")
    return Link(run_id=data["r"], step_id=data["s"], attempt=attempt, opened_at=opened_at)
