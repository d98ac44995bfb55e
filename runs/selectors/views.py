"""What saved views read: a run filter as a dict (a view's, a bulk action's, a rerun's) checked and read into
runs_matching's arguments, the runs it names (runs_of_filter, the one definition their users share), the views a
user may see, and a view's live count."""

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from django.db.models import Q

from .. import attributes, search
from ..errors import NotFound
from ..models import Run, RunAttribute, RunQuerySet, RunStatus, SavedView
from .lists import runs_matching

FILTER_FIELDS = ("status", "workflow", "parent", "stuck", "q", *search.SEARCH_FILTERS)
MAX_Q = 500  # characters of a search box's text
COUNT_LIMIT = 10_000  # a bulk action's set stops here (runs.services.bulk), and its view's count beside it
COUNT_SHOWN = 1_000  # a list of views counts each up to here ("1,000+"): its cost stays that of 1,000 runs
_WORKFLOW = re.compile(r"^([a-z0-9_-]{1,64}|task:[A-Za-z_][A-Za-z0-9_.]{0,58})$")
_YES, _NO = ("1", "true", "on", "yes"), ("", "0", "false", "off", "no")


def _bad(field: str, message: str) -> search.InvalidFilter:
    return search.InvalidFilter(f"{field}: {message}", code="invalid_filter")


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _bad(field, "must be text")
    return value.strip()


def _one(key: str, value: Any, field: str) -> tuple[str, Any] | None:
    """One filter's (argument, value) for runs_matching, or None when it is empty."""
    if key == "stuck":
        if isinstance(value, bool):
            return ("stuck", True) if value else None
        if isinstance(value, str) and value.strip().lower() in _YES + _NO:
            return ("stuck", True) if value.strip().lower() in _YES else None
        raise _bad(field, "must be true or false")
    if key == "input" and isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False)
    text = _text(value, field)
    if not text:
        return None
    if key == "status" and text not in RunStatus.values:
        raise _bad(field, f"must be one of {', '.join(RunStatus.values)}")
    if key == "workflow" and not _WORKFLOW.match(text):
        raise _bad(field, "is not a workflow name (1-64 of a-z 0-9 - _)")
    if key == "parent":
        try:
            return key, uuid.UUID(text)
        except ValueError:
            raise _bad(field, "is not a run id") from None
    if key == "q" and len(text) > MAX_Q:
        raise _bad(field, f"at most {MAX_Q} characters")
    if key == "input":
        return key, search.input_probe(text, field=field)
    if key == "error_code":
        return key, search.error_code_text(text, field=field)
    if key in ("created_after", "created_before"):
        return key, search.moment(text, field=field)
    return key, text


def filter_read(filter: Any, *, prefix: str = "filter.") -> dict[str, Any]:
    """A filter as GET /runs takes its query ({status, workflow, parent, stuck, q, input, created_after,
    created_before, error_code, attr.NAME}, texts; also view: a saved view's id, ids: run ids), checked and read
    into runs_matching's arguments (view kept as it is). InvalidFilter names the first bad field (prefix + key)."""
    if not isinstance(filter, Mapping):
        raise _bad(prefix.rstrip(".") or "filter", "must be an object of filters")
    args: dict[str, Any] = {}
    for key, value in filter.items():
        field = f"{prefix}{key}"
        if isinstance(key, str) and key.startswith(attributes.PREFIX):
            continue
        if key == "view":
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
                raise _bad(field, "must be a saved view's id (a whole number)")
            if not 0 < int(str(value).strip()) < 2**63:
                raise _bad(field, "is not a saved view's id")
            args["view"] = int(str(value).strip())
        elif key == "ids":
            if not isinstance(value, list):
                raise _bad(field, "must be a list of run ids")
            try:
                args["ids"] = [uuid.UUID(str(one)) for one in value]
            except ValueError:
                raise _bad(field, "must be a list of run ids") from None
        elif key in FILTER_FIELDS:
            found = _one(key, value, field)
            if found is not None:
                args[found[0]] = found[1]
        else:
            names = ", ".join((*FILTER_FIELDS, "attr.NAME", "view"))
            raise _bad(field, f"unknown filter; the filters are {names}")
    wanted = attributes.filters_of(filter.items(), prefix=prefix)
    if wanted:
        args["attributes"] = wanted
    return args


def filter_clean(filter: Any, *, prefix: str = "filter.") -> dict[str, Any]:
    """A view's filter as it is kept: checked (filter_read), empty ones dropped, texts as GET /runs's query takes
    them (input as JSON text, stuck true), so the runs page opens it as its query string. No view or ids in it."""
    filter_read(filter, prefix=prefix)
    kept: dict[str, Any] = {}
    for key, value in filter.items():
        if key in ("view", "ids"):
            raise _bad(f"{prefix}{key}", "a saved view's filter names no view and no run ids")
        if key == "stuck":
            if _one(key, value, f"{prefix}{key}") is not None:
                kept[key] = "true"
        elif key == "input" and isinstance(value, dict):
            kept[key] = json.dumps(value, ensure_ascii=False)
        elif isinstance(value, str):
            if value.strip():
                kept[key] = value.strip()
        else:  # an attribute's number or boolean: its text form, which is what it matches
            kept[key] = attributes.text_of(value)
    return kept


# --- the views a user sees -------------------------------------------------------------------------------


def views_visible(*, user) -> Any:
    """The views this user owns or shares a group with (a superuser: every one), by name."""
    views = SavedView.objects.select_related("owner", "group")
    if user.is_superuser:
        return views.all()
    return views.filter(Q(owner=user) | Q(group__in=user.groups.all())).distinct()


def view_get(*, view_id, user=None) -> SavedView:
    """A view by id, when this user may see it (user None: any view); NotFound otherwise."""
    views = SavedView.objects.select_related("owner", "group") if user is None else views_visible(user=user)
    try:
        return views.get(id=int(view_id))
    except (SavedView.DoesNotExist, ValueError, TypeError):
        raise NotFound(
            f"saved view {view_id} does not exist (or is not shared with you)", code="view_not_found"
        ) from None


# --- the runs a filter names --------------------------------------------------------------------------------


def _merged(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any] | None:
    """Two filters AND-ed, as runs_matching's arguments; None when no run can match both (the same filter with two
    values)."""
    merged = dict(first)
    for key, value in second.items():
        if key == "attributes":
            both = {**merged.get(key, {}), **value}
            if any(merged.get(key, {}).get(name, text) != text for name, text in value.items()):
                return None
            merged[key] = both
        elif key == "ids" and key in merged:
            merged[key] = [one for one in merged[key] if one in set(value)]
        elif key in merged and merged[key] != value:
            return None
        else:
            merged[key] = value
    return merged


def filter_args(filter: Any, *, user=None, prefix: str = "filter.") -> dict[str, Any] | None:
    """runs_matching's (and run_list's) arguments of a filter, a view it names read in and AND-ed with the rest
    (user: who must see it; user None: anyone's) and user_id set for q; None when nothing can match."""
    args = filter_read(filter, prefix=prefix)
    view_id = args.pop("view", None)
    if view_id is not None:
        view = view_get(view_id=view_id, user=user)
        merged = _merged(filter_read(view.filter, prefix=f"view {view.id}: "), args)
        if merged is None:
            return None
        args = merged
    if user is not None and "q" in args:
        args["user_id"] = user.pk
    return args


def runs_of_filter(filter: Any, *, user=None, prefix: str = "filter.") -> RunQuerySet:
    """The runs a filter names (filter_read's fields; {"view": id} a saved view's, AND-ed with the others),
    unordered: what a saved view, a bulk action and a rerun select. InvalidFilter (422) names a bad field."""
    args = filter_args(filter, user=user, prefix=prefix)
    return Run.objects.none() if args is None else runs_matching(**args)


def count_capped(rows, *, up_to: int = COUNT_LIMIT) -> tuple[int, bool]:
    """(how many, whether there are more than up_to) of a queryset of one column: up_to + 1 rows read at most."""
    found = rows.order_by()[: up_to + 1].count()
    return min(found, up_to), found > up_to


def view_count(*, view: SavedView, user=None, up_to: int = COUNT_SHOWN) -> tuple[int, bool]:
    """The live count of a view's runs, up to up_to (count_capped): what a list of views shows."""
    args = filter_args({"view": view.id}, user=user)
    if args is None:
        return 0, False
    wanted = args.get("attributes") or {}
    if set(args) == {"attributes"} and len(wanted) == 1:
        # One attribute alone: its index, read alone ((run, name) is the key: a run at most once).
        [(name, text)] = wanted.items()
        return count_capped(RunAttribute.objects.filter(name=name, text=text).values("run_id"), up_to=up_to)
    return count_capped(runs_matching(**args).values("id"), up_to=up_to)
