from importlib import import_module

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Django's hook for what needs the app registry loaded: these imports reach the models.
        from django.db.backends.signals import connection_created

        from . import checks, steps  # noqa: F401  registers the system checks, the built-in step kinds and tools
        from .metrics import receivers_connect
        from .search import sqlite_functions_register

        # SQLite's stand-in for jsonb @> (the run list's input filter), on each connection it opens.
        connection_created.connect(sqlite_functions_register, dispatch_uid="runs.search.sqlite_functions")
        receivers_connect()  # GET /metrics: the sweep's re-drives and fenced-out walks (runs.metrics)
        workflow_modules_import()


def workflow_modules_import() -> None:
    """Python workflows register on import (pal.workflows): each app's workflows.py, found as admin.py is, and the
    modules of PAL_WORKFLOW_MODULES (one that cannot be imported stops the process with its ImportError)."""
    autodiscover_modules("workflows")
    for path in settings.PAL_WORKFLOW_MODULES:
        import_module(path)
