"""The execution: drive (a task's slice of a run), the run's walk, the graph scheduler, fleet items, the one
journal writer and a step's capabilities. Celery's tasks call run_drive and run_item."""

from .drive import run_drive
from .fleet import run_item

__all__ = ["run_drive", "run_item"]
