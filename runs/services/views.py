"""Saved views: a filter of the run list saved with a name by its owner, shared with one of the owner's groups."""

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from .. import selectors
from ..errors import Conflict, ServiceError
from ..models import SavedView

MAX_NAME = 100


class InvalidView(ServiceError):
    status = 422


def view_create(*, name: str, filter: dict, owner, group: str | None = None) -> SavedView:
    """Save a filter (GET /runs's fields, attr.NAME too: runs.selectors.filter_clean) as a view of owner's, shared
    with the group named (one the owner belongs to; a superuser: any). 422 names a bad field; 409 a name the owner
    has already given a view."""
    name = name.strip() if isinstance(name, str) else ""
    if not name or len(name) > MAX_NAME:
        raise InvalidView(f"name: 1-{MAX_NAME} characters", code="invalid_view")
    kept = selectors.filter_clean(filter)
    shared = None
    if group is not None and group.strip():
        shared = Group.objects.filter(name=group.strip()).first()
        if shared is None:
            raise InvalidView(f"group: no group is named {group.strip()!r}", code="invalid_view")
        if not owner.is_superuser and not owner.groups.filter(id=shared.id).exists():
            raise InvalidView(f"group: you are not a member of {shared.name!r}", code="invalid_view")
    try:
        with transaction.atomic():
            return SavedView.objects.create(name=name, filter=kept, owner=owner, group=shared)
    except IntegrityError:
        raise Conflict(f"you have a view named {name!r} already", code="view_exists") from None


def view_delete(*, view_id, user) -> None:
    """Delete a view: its owner (or a superuser) only; a member of its group gets 403."""
    view = selectors.view_get(view_id=view_id, user=user)
    if view.owner_id != user.pk and not user.is_superuser:
        raise ServiceError(
            f"only {view.owner.get_username()} may delete view {view.name!r}", code="not_view_owner", status=403
        )
    view.delete()
