from django.apps import AppConfig


class BillingConfig(AppConfig):
    """A user's Django app, installed only by tests.apps.settings: its workflows.py is found at start-up."""

    name = "tests.apps.billing"
    label = "billing"
