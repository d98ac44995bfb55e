import os

from django.core.asgi import get_asgi_application
from django.db import connections

from pal.db_pool import pool_checks_install
from pal.telemetry import tracing_setup
from pal.web import Application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
# Under ASGI a sync view may run on a new thread per request: a persistent connection would stay open on each,
# so the web app borrows connections from a pool instead (Postgres; SQLite simply does not keep them).
os.environ.setdefault("PAL_DB_CONN_MAX_AGE", "0")
os.environ.setdefault("PAL_DB_POOL", "1")
# Traces, only with OTEL_EXPORTER_OTLP_ENDPOINT (pal.telemetry): before the app loads its middleware.
tracing_setup("pal-web")
# Sync views in one hop to a fixed pool of threads, async ones (the event streams) on Django's handler (pal.web).
application = Application(get_asgi_application())
# A pooled connection is checked by a look at its socket, a round trip only when that finds something (pal.db_pool).
pool_checks_install(connections["default"])
