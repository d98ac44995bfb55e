"""The project's settings with one more installed app, tests.apps.billing (whose workflows.py is autodiscovered)."""

from pal.settings import *  # noqa: F403
from pal.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.apps.billing"]
