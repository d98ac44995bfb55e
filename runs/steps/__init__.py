"""Step kinds, registered by name on import (runs.apps.RunsConfig.ready)."""

from ..errors import StepError, Wait  # noqa: F401
from . import agent, child, deliver, django_task, llm, python, tools, waits  # noqa: F401
from .base import REGISTRY, StepContext, StepKind, get_kind, register  # noqa: F401
