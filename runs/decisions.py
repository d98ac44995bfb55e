"""An approval's typed fields (docs/reference/workflows.md, `approval`): its `form`, `choices`, `assign`, `on_timeout`,
`notify` and `link_decides`, checked when the workflow is posted; who may decide it (its assignee, or a superuser);
what a decision must carry (an answer that fits the form, one of the choices); and the step's output from it."""

import re
from typing import Any

from .answers import CHOICE, AnswerInvalid, answer_checked, form_problems
from .errors import ServiceError, StepError

MAX_CHOICES = 20
# What an approval's request carries besides its prompt, into its wait and its approval_requested row: what the
# inbox draws and what a decision is checked against (a run that parked keeps them as they were when it asked).
REQUEST_KEYS = ("form", "choices", "assign", "on_timeout", "link_decides")
TIMED_OUT = "timeout"  # the `by` of a decision the engine took at an approval's deadline


def approval_problems(step: dict) -> list[tuple[str, str]]:
    """The typed fields of an approval step: (field, what is wrong)."""
    problems: list[tuple[str, str]] = []
    form, choices = step.get("form"), step.get("choices")
    if "form" in step:
        problems += [(f"form{where}", what) for where, what in form_problems(form)]
    if "choices" in step:
        problems += [("choices", what) for what in _choices_problems(choices)]
        if isinstance(form, dict) and CHOICE in (form.get("properties") or {}):
            problems.append(("form.properties.choice", "is the answer's choice (choices): name the field otherwise"))
    if "assign" in step:
        problems += [(f"assign{where}", what) for where, what in _assign_problems(step["assign"])]
    if "on_timeout" in step:
        problems += [(f"on_timeout{where}", what) for where, what in _on_timeout_problems(step)]
    if "notify" in step:
        problems += [(f"notify{where}", what) for where, what in _notify_problems(step["notify"])]
    if "link_decides" in step:
        if not isinstance(step["link_decides"], bool):
            problems.append(("link_decides", "must be true or false"))
        elif step["link_decides"] and "notify" not in step:
            problems.append(("link_decides", "needs notify: the signed link goes out in the notification"))
    return problems


def _choices_problems(choices: Any) -> list[str]:
    if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
        return [f"must be a list of 1 to {MAX_CHOICES} choices"]
    if not all(isinstance(c, str) and c.strip() and len(c) <= 64 for c in choices):
        return ["every choice is a non-empty string of at most 64 characters"]
    if len(set(choices)) != len(choices):
        return ["has a choice twice"]
    return []


def _assign_problems(assign: Any) -> list[tuple[str, str]]:
    if not isinstance(assign, dict) or len(assign) != 1 or next(iter(assign)) not in ("user", "group"):
        return [("", 'must be {"user": NAME} or {"group": NAME} (a name or a template of the input)')]
    ((who, name),) = assign.items()
    if not isinstance(name, str) or not name.strip() or len(name) > 150:
        return [(f".{who}", "must be a user or group name (at most 150 characters), or a template")]
    return []


def _on_timeout_problems(step: dict) -> list[tuple[str, str]]:
    value = step["on_timeout"]
    if "timeout_seconds" not in step:
        return [("", "needs timeout_seconds: the time the approval waits for a person")]
    if value in ("reject", "approve"):
        return []
    if not isinstance(value, dict):
        return [("", 'must be "reject", "approve" or a default answer (an object)')]
    if "form" not in step and "choices" not in step:
        return [("", 'a default answer needs a form or choices; say "approve" or "reject"')]
    try:
        typed_answer(
            step, approved=True, answer=_answer_part(step, value), choice=value.get(CHOICE), where="on_timeout"
        )
    except ServiceError as exc:
        field = exc.detail.split(":", 1)[0]
        return [(field.removeprefix("on_timeout"), exc.detail.split(": ", 1)[-1])]
    return []


def _answer_part(step: dict, value: dict) -> dict | None:
    """The form's answer in a default answer (its fields without the choice), or None without a form."""
    if "form" not in step:
        return None
    return {k: v for k, v in value.items() if not ("choices" in step and k == CHOICE)}


def _notify_problems(notify: Any) -> list[tuple[str, str]]:
    if not isinstance(notify, dict) or not notify or set(notify) - {"email", "webhook"}:
        return [("", 'must be {"email": [addresses], "webhook": "https://..."} (one or both)')]
    problems = []
    if "email" in notify:
        to = notify["email"]
        if not (isinstance(to, list) and to and all(isinstance(a, str) and ("@" in a or "{{" in a) for a in to)):
            problems.append((".email", "must be a non-empty list of email addresses"))
    if "webhook" in notify:
        url = notify["webhook"]
        if not isinstance(url, str) or not re.match(r"^(https?://|\{\{)", url):
            problems.append((".webhook", "must be an http:// or https:// URL"))
    return problems


# --- the request, the assignee, the decision ----------------------------------------------------------


def request_of(fields: dict) -> dict:
    """What an approval's wait and approval_requested carry of its fields (assign rendered: a name, flattened to
    assign_user / assign_group too, which the inbox's filters match in SQL)."""
    request = {key: fields[key] for key in REQUEST_KEYS if key in fields}
    assign = fields.get("assign")
    if isinstance(assign, dict):
        ((who, name),) = assign.items()
        request["assign"] = {who: str(name)}
        request[f"assign_{who}"] = str(name)
    return request


def assignee_text(request: dict) -> str:
    """ "user alice", "group billing" or "" (anyone with the operator permission)."""
    assign = request.get("assign") or {}
    return " ".join(f"{who} {name}" for who, name in assign.items())


def may_decide(request: dict, user: Any) -> bool:
    """Whether this Django user may decide the approval: anyone when it is not assigned; else its user, a member of
    its group, or a superuser."""
    assign = request.get("assign") or {}
    if not assign:
        return True
    if user is None or not getattr(user, "is_active", False):
        return False
    if user.is_superuser:
        return True
    if "user" in assign:
        return user.get_username() == assign["user"]
    return user.groups.filter(name=assign.get("group")).exists()


def typed_answer(
    request: dict, *, approved: bool, answer: Any = None, choice: Any = None, where: str = "answer"
) -> dict:
    """What a decision adds to its approval_decided row: {"answer"} (checked against the form) and {"choice"} (one
    of the choices), when it approves an approval that has them; a rejection carries neither. 422 naming the field."""
    form, choices = request.get("form"), request.get("choices")
    prefix = "" if where == "answer" else f"{where}."
    if not approved:
        return {}
    typed: dict[str, Any] = {}
    if choices:
        if choice is None:
            raise _invalid(f"{prefix}{CHOICE}: is required: one of {', '.join(choices)}")
        if choice not in choices:
            raise _invalid(f"{prefix}{CHOICE}: {choice!r} is not one of {', '.join(choices)}")
        typed["choice"] = choice
    elif choice is not None:
        raise _invalid(f"{prefix}{CHOICE}: this approval offers no choices")
    if form:
        try:
            typed["answer"] = answer_checked(form, answer if answer is not None else {}, where=where)
        except AnswerInvalid as exc:
            raise _invalid(f"{exc.field}: {exc.message}") from None
    elif answer is not None:
        raise _invalid(f"{where}: this approval has no form")
    return typed


def _invalid(detail: str) -> ServiceError:
    return ServiceError(detail, code="invalid_answer", status=422)


def timeout_decision(request: dict, *, seconds: Any) -> dict:
    """The decision the engine takes at the deadline: on_timeout's (reject by default), journaled by "timeout"."""
    on_timeout = request.get("on_timeout", "reject")
    decision: dict[str, Any] = {
        "approved": on_timeout != "reject",
        "by": TIMED_OUT,
        "comment": f"no decision within {seconds} s",
        "timed_out": True,
    }
    if isinstance(on_timeout, dict):
        form_answer = _answer_part(request, on_timeout)
        decision.update(typed_answer(request, approved=True, answer=form_answer, choice=on_timeout.get(CHOICE)))
    return decision


def decision_output(fields: dict, decided: dict) -> Any:
    """The approval step's output from its decision: a form's validated answer (with its choice); a choice's
    {"approved", "choice", "by", "comment"}; else {"approved", "by", "comment"}. A rejection is the step's failure."""
    by, comment = decided.get("by"), decided.get("comment", "")
    if not decided.get("approved"):
        timed_out = " (its deadline passed)" if decided.get("timed_out") else ""
        raise StepError(
            f"rejected by {by}{timed_out}: {comment or 'no comment'}",
            code="approval_timed_out" if decided.get("timed_out") else "approval_rejected",
            details={"by": by, "comment": comment},
        )
    if fields.get("form"):
        output = dict(decided.get("answer") or {})
        if fields.get("choices"):
            output[CHOICE] = decided.get("choice")
        return output
    if fields.get("choices"):
        return {"approved": True, "choice": decided.get("choice"), "by": by, "comment": comment}
    return {"approved": True, "by": by, "comment": comment}
