"""Text that PostgreSQL cannot store: NUL (U+0000) and unpaired surrogates (U+D800..U+DFFF).
What comes from a peer is stored escaped and read back as it came; what comes in through the API is refused
(first_unstorable names where)."""

# Neither `text` nor `jsonb` holds them (jsonb refuses even the escape "\u0000"), yet a peer may send them: a
# model's answer, a tool's or an agent's output, a webhook's answer, an error message. What comes from a peer is
# kept without loss (docs/reference/journal.md): a JSON value is stored with each such string in an escaped form and
# read back as it came. What comes in through the API is refused instead (first_unstorable names where).
#
# The escaped form of a string is ESCAPED followed by the string with every backslash doubled and every NUL or
# surrogate written as \uXXXX. A string that already starts with ESCAPED is escaped too, so a stored string
# that starts with it is always an escaped one: the scheme is reversible for every string. ESCAPED begins with a
# private-use character, so ordinary text never pays for that rule.
#
# One layer applies it: the JSON that reaches the database. journal.services.dumps for the journal's rows (the
# hash chain hashes the stored, escaped text), and StorableJSONEncoder / StorableJSONDecoder for the JSONFields
# that hold peer data, so every ORM reader, values_list() included, gets the text as it came. The fast path is
# one regex scan of the serialised text; only a value that holds a suspect string is walked.

import json
import re
from typing import Any

ESCAPED = "\ue000pal-escaped:"

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_TO_ESCAPE = re.compile("[\\\\\x00\ud800-\udfff]")
_ESCAPE_SEQUENCE = re.compile(r"\\(\\|u[0-9a-f]{4})")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f]")
_RAW_SUSPECT = re.compile("[\ud800-\udfff\ue000]")


def _needs_escape(text: str) -> bool:
    return _UNSTORABLE.search(text) is not None or text.startswith(ESCAPED)


def _escape_char(match: re.Match) -> str:
    char = match.group()
    return "\\\\" if char == "\\" else f"\\u{ord(char):04x}"


def _unescape_sequence(match: re.Match) -> str:
    body = match.group(1)
    return "\\" if body == "\\" else chr(int(body[1:], 16))


def escape_text(text: str) -> str:
    return ESCAPED + _TO_ESCAPE.sub(_escape_char, text) if _needs_escape(text) else text


def unescape_text(text: str) -> str:
    if not text.startswith(ESCAPED):
        return text
    return _ESCAPE_SEQUENCE.sub(_unescape_sequence, text[len(ESCAPED) :])


def escape(value: Any) -> Any:
    """The storable form of a JSON value: every string (dict keys too) that PostgreSQL cannot hold, or that
    starts with ESCAPED, in its escaped form. Other values are returned as they are."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {escape(k) if isinstance(k, str) else k: escape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape(v) for v in value]
    return value


def unescape(value: Any) -> Any:
    """The inverse of escape(): unescape(escape(v)) == v for every JSON value v."""
    if isinstance(value, str):
        return unescape_text(value)
    if isinstance(value, dict):
        return {unescape(k) if isinstance(k, str) else k: unescape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescape(v) for v in value]
    return value


def _suspect(text: str) -> bool:
    """Whether JSON written with ensure_ascii may hold a NUL, a surrogate or ESCAPED (whose first character
    is U+E000): each can appear only as its lowercase \\u escape. Plain substring scans, so most text costs a
    fraction of its json.dumps; a literal backslash before "u0000" also counts, which costs a walk, never a
    wrong answer."""
    if "\\u" not in text:
        return False
    return "\\u0000" in text or "\\ue000" in text or ("\\ud" in text and _SURROGATE_ESCAPE.search(text) is not None)


def storable_json(text: str, *, reencode, raw) -> str:
    """text, JSON written with ensure_ascii, when it holds nothing to escape; else reencode(escape(value))."""
    # The value to escape is read from raw(), the same JSON written with ensure_ascii=False: there a string's
    # surrogates stand as they are, while in text a lone high surrogate followed by a lone low one reads back as
    # one astral character (json.loads joins the two escapes). Going through JSON at all means the walk sees plain
    # JSON (whatever an encoder's default() made of a datetime or an object), so nothing it produced slips past.
    if not _suspect(text):
        return text
    return reencode(escape(json.loads(raw())))


class StorableJSONEncoder(json.JSONEncoder):
    """A JSONField encoder that writes unstorable strings in their escaped form (see the module docstring)."""

    def encode(self, o):
        text = super().encode(o)
        if self.ensure_ascii:
            return storable_json(text, reencode=super().encode, raw=lambda: self._raw(o))
        # ensure_ascii=False (a form showing the field) leaves the characters raw, but a NUL is always escaped.
        suspect = bool(_RAW_SUSPECT.search(text) or "\\u0000" in text)
        return super().encode(escape(json.loads(text))) if suspect else text

    def _raw(self, o) -> str:
        """o written with ensure_ascii=False (see storable_json); this encoder is made for one call."""
        self.ensure_ascii = False
        try:
            return super().encode(o)
        finally:
            self.ensure_ascii = True


class StorableJSONDecoder(json.JSONDecoder):
    """A JSONField decoder that reads escaped strings back as they came."""

    def decode(self, s, *args, **kwargs):
        try:
            value = super().decode(s, *args, **kwargs)
        except json.JSONDecodeError:
            # SQLite answers a key lookup on a string (values_list("payload__why")) with the bare string.
            if isinstance(s, str) and s.startswith(ESCAPED):
                return unescape_text(s)
            raise
        # ESCAPED's first character, raw (Postgres writes jsonb out as UTF-8) or as we wrote it (SQLite).
        return unescape(value) if ("\ue000" in s or "\\ue000" in s) else value


# --- text shown as it came ------------------------------------------------------------------------


def utf8_safe_json(text: str) -> str:
    """Serialised JSON (ensure_ascii=False) that encodes as UTF-8: each unpaired surrogate written as its \\uXXXX
    escape, which is how it arrived and what it decodes back to. Raw surrogates can stand only inside strings, so
    the JSON still means the same value. For pages, receipts and any answer sent with non-ASCII text as itself."""
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# --- text refused at the edge ---------------------------------------------------------------------


def _describe(text: str) -> str:
    """A string with its unstorable characters written as \\uXXXX, safe to put in an answer or a log line."""
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _problem(text: str) -> str:
    found = _UNSTORABLE.search(text)
    assert found is not None, "called only for text that holds an unstorable character"
    char = found.group()
    if char == "\x00":
        return "holds a NUL character (U+0000), which cannot be stored"
    return f"holds an unpaired surrogate (U+{ord(char):04X}), which is not valid Unicode text"


def first_unstorable(value: Any, loc: str = "") -> tuple[str, str] | None:
    """Where value first holds text PostgreSQL cannot store, as (loc, msg); None when it holds none.

    loc is written like the API's validation errors ("input.note", "steps[2].prompt"); a bad key is named with
    its bad characters as \\uXXXX."""
    if isinstance(value, str):
        return (loc, _problem(value)) if _UNSTORABLE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = key if isinstance(key, str) else str(key)
            here = f"{loc}.{_describe(name)}" if loc else _describe(name)
            if _UNSTORABLE.search(name):
                return here, f"the key {_problem(name)}"
            found = first_unstorable(item, here)
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_unstorable(item, f"{loc}[{index}]")
            if found:
                return found
    return None


# --- numbers JSON cannot carry ---------------------------------------------------------------------

# Python's json reads NaN, Infinity and 1e999 (as inf), which no JSON column stores; and refuses a whole number
# longer than this many digits (sys.get_int_max_str_digits' default) with a ValueError of its own.
MAX_INT_DIGITS = 4300


class NonFinite:
    """A number of a JSON text that is no finite number (NaN, Infinity, 1e999, a 5,000-digit integer)."""

    def __init__(self, text: str, why: str):
        self.text, self.why = text, why


def _float_or_marker(text: str) -> Any:
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else NonFinite(text, "is too large for a number")


def _int_or_marker(text: str) -> Any:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return NonFinite(text[:12] + "…", f"has more than {MAX_INT_DIGITS} digits")
    return int(text)


def loads_marking_nonfinite(raw: str | bytes) -> Any:
    """json.loads, with every number that is not a finite one read as a NonFinite marker (first_nonfinite)."""
    return json.loads(
        raw,
        parse_constant=lambda text: NonFinite(text, "is not a number JSON allows"),
        parse_float=_float_or_marker,
        parse_int=_int_or_marker,
    )


def first_nonfinite(value: Any, loc: str = "") -> tuple[str, str] | None:
    """Where a value of loads_marking_nonfinite first holds a NonFinite, as (loc, msg) like first_unstorable."""
    if isinstance(value, NonFinite):
        return loc, f"{value.text} {value.why}: only finite numbers are accepted"
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_nonfinite(item, f"{loc}.{_describe(key)}" if loc else _describe(key))
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = first_nonfinite(item, f"{loc}[{index}]")
            if found:
                return found
    return None
