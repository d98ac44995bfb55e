"""The permission names of the two roles, written once: the API's token check (tokens.auth), the operator's pages
(runs.pages.access) and the admin (runs.admin) all read them here.

runs.models declares the permissions (Workflow.Meta: "operate"; Django adds "view_run" for Run). This module
imports nothing, so runs and tokens can both use it without either importing the other's views.
"""

VIEW_RUN = "runs.view_run"
"""Read runs, their journal, waterfall and receipt."""
OPERATE = "runs.operate"
"""Change state: create, cancel, re-drive, retry, approve, signal, resolve a side effect, bulk actions."""

READ_PERMISSIONS: tuple[str, ...] = (VIEW_RUN, OPERATE)
"""Any one of these lets a user read (an operator can also read)."""
OPERATE_PERMISSIONS: tuple[str, ...] = (OPERATE,)
"""Every action needs this one."""

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {"viewer": READ_PERMISSIONS, "operator": OPERATE_PERMISSIONS}
"""Each role's permissions, any one of which grants the role (a superuser has them all)."""


def has_role(user, role: str) -> bool:
    """Whether the user holds the role: any one of its permissions (user.has_perm, which is False for an inactive
    user and True for an active superuser)."""
    return any(user.has_perm(p) for p in ROLE_PERMISSIONS[role])
