"""The answer of a typed decision: an approval's `form`, a JSON Schema of the answer, in the subset this module knows
(jsonschema is not among the requirements): an object of typed properties (string, integer, number, boolean), with
`required`, `enum`, `minimum` / `maximum`, `minLength` / `maxLength`, `title`, `description`, `default`. A form is
checked when its workflow is posted (form_problems), an answer when it is given (answer_problems: each names its
field, e.g. `answer.amount`), and a posted HTML form is read into an answer by the form's types (answer_from_form).
"""

import math
from collections.abc import Mapping
from typing import Any

TYPES = ("string", "integer", "number", "boolean")
FORM_KEYS = {"type", "properties", "required", "title", "description", "additionalProperties"}
PROPERTY_KEYS = {"type", "title", "description", "enum", "default", "minimum", "maximum", "minLength", "maxLength"}
MAX_PROPERTIES = 50
MAX_ENUM = 100
CHOICE = "choice"  # the answer's key of an approval's choice (its `choices`)


class AnswerInvalid(ValueError):
    """An answer does not fit its form: field is where ("answer.amount"), message what."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def _number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


def _fits_type(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    return _number(value)


def form_problems(form: Any) -> list[tuple[str, str]]:
    """What is wrong with a form (where under the form, what), empty when it is one this module knows."""
    if not isinstance(form, dict):
        return [("", "must be a JSON Schema object: {type: object, properties: {...}}")]
    problems = [(f".{key}", "is not a keyword this form knows") for key in form if key not in FORM_KEYS]
    if form.get("type") != "object":
        problems.append((".type", 'must be "object": the answer is an object of fields'))
    properties = form.get("properties")
    if not isinstance(properties, dict) or not properties:
        return [*problems, (".properties", "must be a non-empty object of fields")]
    if len(properties) > MAX_PROPERTIES:
        problems.append((".properties", f"has {len(properties)} fields; at most {MAX_PROPERTIES}"))
    for name, spec in properties.items():
        problems += [(f".properties.{name}{where}", what) for where, what in _property_problems(name, spec)]
    required = form.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        problems.append((".required", "must be a list of field names"))
    else:
        problems += [
            (".required", f"names {name!r}, which is not a field") for name in required if name not in properties
        ]
    if form.get("additionalProperties", False) is not False:
        problems.append((".additionalProperties", "must be false (an answer holds only the form's fields)"))
    for key in ("title", "description"):
        if key in form and not isinstance(form[key], str):
            problems.append((f".{key}", "must be a string"))
    return problems


def _property_problems(name: str, spec: Any) -> list[tuple[str, str]]:
    if not isinstance(name, str) or not name or len(name) > 64 or not name.replace("_", "").replace("-", "").isalnum():
        return [("", "a field's name is 1-64 letters, digits, - and _")]
    if not isinstance(spec, dict):
        return [("", "must be an object with a type")]
    problems = [(f".{key}", "is not a keyword this form knows") for key in spec if key not in PROPERTY_KEYS]
    kind = spec.get("type")
    if kind not in TYPES:
        return [*problems, (".type", f"must be one of {', '.join(TYPES)}")]
    if "enum" in spec:
        enum = spec["enum"]
        if not isinstance(enum, list) or not enum or len(enum) > MAX_ENUM:
            problems.append((".enum", f"must be a list of 1 to {MAX_ENUM} values"))
        elif not all(_fits_type(kind, value) for value in enum):
            problems.append((".enum", f"every value must be a {kind}"))
        elif kind == "boolean":
            problems.append((".enum", "a boolean field takes no enum"))
    numeric = ("minimum", "maximum")
    for key in numeric:
        if key in spec and (kind not in ("integer", "number") or not _number(spec[key])):
            problems.append((f".{key}", "is a number, and only for an integer or number field"))
    for key in ("minLength", "maxLength"):
        if key in spec and (
            kind != "string" or not isinstance(spec[key], int) or isinstance(spec[key], bool) or spec[key] < 0
        ):
            problems.append((f".{key}", "is a whole number from 0, and only for a string field"))
    for key in ("title", "description"):
        if key in spec and not isinstance(spec[key], str):
            problems.append((f".{key}", "must be a string"))
    if "default" in spec and not problems:
        problems += [(".default", message) for message in _value_problems(spec, spec["default"])]
    return problems


def _value_problems(spec: dict, value: Any) -> list[str]:
    kind = spec["type"]
    if not _fits_type(kind, value):
        return [f"must be {'an' if kind == 'integer' else 'a'} {kind}"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"must be one of {', '.join(map(str, spec['enum']))}"]
    problems = []
    if "minimum" in spec and value < spec["minimum"]:
        problems.append(f"must be at least {spec['minimum']}")
    if "maximum" in spec and value > spec["maximum"]:
        problems.append(f"must be at most {spec['maximum']}")
    if "minLength" in spec and len(value) < spec["minLength"]:
        problems.append(f"must be at least {spec['minLength']} characters")
    if "maxLength" in spec and len(value) > spec["maxLength"]:
        problems.append(f"must be at most {spec['maxLength']} characters")
    return problems


def answer_problems(form: dict, answer: Any, *, where: str = "answer") -> list[tuple[str, str]]:
    """Every way the answer does not fit the form: (field, message), the field under `where`."""
    if not isinstance(answer, Mapping):
        return [(where, "must be a JSON object of the form's fields")]
    properties = form.get("properties") or {}
    problems = [(f"{where}.{name}", "is not a field of the form") for name in answer if name not in properties]
    for name in form.get("required") or []:
        if name not in answer:
            problems.append((f"{where}.{name}", "is required"))
    for name, value in answer.items():
        if name in properties:
            problems += [(f"{where}.{name}", message) for message in _value_problems(properties[name], value)]
    return problems


def answer_checked(form: dict, answer: Any, *, where: str = "answer") -> dict:
    """The answer as the step outputs it (an integer field's 3.0 as 3); AnswerInvalid naming the first bad field."""
    problems = answer_problems(form, answer, where=where)
    if problems:
        raise AnswerInvalid(*problems[0])
    properties = form.get("properties") or {}
    return {
        name: int(value) if properties[name]["type"] == "integer" else value for name, value in dict(answer).items()
    }


def fields_of(form: dict) -> list[dict]:
    """The form's fields in order, as a page draws them: {name, type, label, help, required, enum, minimum,
    maximum, minLength, maxLength, default}."""
    required = set(form.get("required") or [])
    return [
        {
            "name": name,
            "type": spec["type"],
            "label": spec.get("title") or name.replace("_", " "),
            "help": spec.get("description", ""),
            "required": name in required,
            "enum": spec.get("enum"),
            "minimum": spec.get("minimum"),
            "maximum": spec.get("maximum"),
            "minLength": spec.get("minLength"),
            "maxLength": spec.get("maxLength"),
            "default": spec.get("default"),
        }
        for name, spec in (form.get("properties") or {}).items()
    ]


def answer_from_form(form: dict, data: Mapping[str, str], *, prefix: str = "answer.") -> dict:
    """An HTML form's fields (`answer.NAME`, text) read into an answer by the form's types: a number as a number, a
    boolean checkbox as true / false, an empty optional field left out. AnswerInvalid naming a field that is no
    number; the answer is then checked as any (answer_checked)."""
    answer: dict[str, Any] = {}
    for name, spec in (form.get("properties") or {}).items():
        raw = data.get(prefix + name)
        kind = spec["type"]
        if kind == "boolean":
            answer[name] = raw in ("1", "on", "true", "yes")
            continue
        if raw is None or raw.strip() == "":
            continue
        if kind == "string":
            answer[name] = raw
            continue
        try:
            number = float(raw.strip())
        except ValueError:
            raise AnswerInvalid(
                f"answer.{name}", f"must be {'a whole number' if kind == 'integer' else 'a number'}"
            ) from None
        if not math.isfinite(number):
            raise AnswerInvalid(f"answer.{name}", "must be a finite number")
        if kind == "integer":
            if not number.is_integer():
                raise AnswerInvalid(f"answer.{name}", "must be a whole number")
            answer[name] = int(number)
        else:
            answer[name] = int(number) if number.is_integer() and "." not in raw and "e" not in raw.lower() else number
    return answer
