import json
import sys

from django.core.management.base import BaseCommand, CommandError

from runs.selectors import CHECK_RUNS
from runs.services import ServiceError, workflow_check
from runs.workflows import WorkflowInvalid


class Command(BaseCommand):
    help = (
        "pal_check_definition FILE.json [--runs N] [--all]: replay the journals of the most recent runs of that "
        "workflow that have not ended (--all: any) against the definition in FILE, calling nothing and storing "
        "nothing. Exit 0 when none would diverge; else exit 1 with one line per diverging run and step."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE.json")
        parser.add_argument("--runs", type=int, default=CHECK_RUNS, help=f"the most recent runs ({CHECK_RUNS})")
        parser.add_argument("--all", action="store_true", help="runs that ended too, not only those that have not")

    def handle(self, *args, file: str, runs: int = CHECK_RUNS, all: bool = False, **options):
        if runs < 1:
            raise CommandError("--runs must be 1 or more")
        try:
            with open(file, encoding="utf-8") as handle:
                definition = json.load(handle)
        except (OSError, ValueError) as exc:
            raise CommandError(f"{file}: {exc}") from None
        if not isinstance(definition, dict):
            raise CommandError(f"{file}: a workflow definition is a JSON object")
        try:
            found = workflow_check(definition=definition, runs=runs, ended=all)
        except WorkflowInvalid as exc:
            raise CommandError(f"{file}: the workflow is not valid: {exc}") from None
        except ServiceError as exc:
            raise CommandError(f"{file}: {exc.detail}") from None
        name, checked = definition["name"], found["checked"]
        for entry in found["diverging"]:
            self.stdout.write(
                f"{entry['run_id']} {name} v{entry['version']}: step {entry['step_id']} ({entry['code']}): "
                f"{entry['why']}"
            )
        if found["diverging"]:
            runs_hit = len({entry["run_id"] for entry in found["diverging"]})
            self.stderr.write(f"{runs_hit} of {checked} runs of {name} would diverge from {file}")
            sys.exit(1)
        which = "runs" if all else "runs that have not ended"
        self.stdout.write(f"OK: {checked} {which} of {name} replay against {file}")
