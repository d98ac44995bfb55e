"""The Celery app: autodiscovered tasks and the beat schedule of the recovery sweep."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")

app = Celery("pal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
