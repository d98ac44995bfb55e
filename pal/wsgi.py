import os

from django.core.wsgi import get_wsgi_application

from pal.telemetry import tracing_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
# Traces, only with OTEL_EXPORTER_OTLP_ENDPOINT (pal.telemetry): before the app loads its middleware.
tracing_setup("pal-web")
application = get_wsgi_application()
