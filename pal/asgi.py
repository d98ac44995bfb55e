import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
# Under ASGI a sync view may run on a new thread per request: a persistent connection would stay open on each,
# so the web app borrows connections from a pool instead (Postgres; SQLite simply does not keep them).
os.environ.setdefault("PAL_DB_CONN_MAX_AGE", "0")
os.environ.setdefault("PAL_DB_POOL", "1")
application = get_asgi_application()
