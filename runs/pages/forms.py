"""What the pages' forms share: JSON typed into a text box, read the way the API reads a body.

json_from_text gives the value or a ValidationError that names what is wrong (where, for a number no JSON column
stores or text PostgreSQL cannot store), so a page refuses with a message what the API refuses with a 422.
"""

import json
from typing import Any

from django import forms

from journal.text import first_nonfinite, first_unstorable, loads_marking_nonfinite

_KINDS = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}


def json_from_text(text: str) -> Any:
    """The JSON value of text; a ValidationError saying why when it is not JSON a run can keep."""
    try:
        value = loads_marking_nonfinite(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", code="invalid_json"
        ) from None
    problem = first_nonfinite(value) or first_unstorable(value)
    if problem is not None:
        where, what = problem
        raise forms.ValidationError(f"{where}: {what}" if where else what, code="invalid_json")
    return value


class JsonObjectField(forms.CharField):
    """A text box that must hold a JSON object; blank gives `empty` ({} or None)."""

    def __init__(self, *, rows: int = 8, empty: dict | None = None, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": rows, "spellcheck": "false"}))
        super().__init__(**kwargs)
        self.empty = empty

    def clean(self, value: Any) -> dict | None:
        text = (super().clean(value) or "").strip()
        if not text:
            return None if self.empty is None else dict(self.empty)
        parsed = json_from_text(text)
        if not isinstance(parsed, dict):
            kind = _KINDS.get(type(parsed), "a number")
            raise forms.ValidationError(f"must be a JSON object ({{...}}), not {kind}", code="invalid_input")
        return parsed
