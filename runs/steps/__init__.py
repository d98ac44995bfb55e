"""Step kinds, registered by name on import (runs.apps.RunsConfig.ready)."""

from . import agent, child, deliver, llm, tools, waits  # noqa: F401
from .base import REGISTRY, StepContext, StepError, StepKind, Wait, get_kind, register  # noqa: F401
