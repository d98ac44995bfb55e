import sys

from django.core.management.base import BaseCommand, CommandError

from journal.selectors import replay_rows_for_run
from runs.code import WORKFLOWS
from runs.models import Run
from runs.walk.code import dry_replay


class Command(BaseCommand):
    help = (
        "pal_check_workflows [NAME ...]: replay the journals of the recent runs of each Python workflow (all, or "
        "those named) against the code as it is now, calling nothing. Exit 0 when every run replays; else exit 1 "
        "with one line per diverging run: its id, the step its journal holds and the one the code asks for."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME")
        parser.add_argument("--runs", type=int, default=100, help="the most recent runs of each workflow (100)")

    def handle(self, *args, names=(), runs=100, **options):
        unknown = [name for name in names if name not in WORKFLOWS]
        if unknown:
            known = ", ".join(sorted(WORKFLOWS)) or "none is loaded (PAL_WORKFLOW_MODULES, an app's workflows.py)"
            raise CommandError(f"not a Python workflow: {', '.join(unknown)}; the Python workflows: {known}")
        if runs < 1:
            raise CommandError("--runs must be 1 or more")
        diverging = checked = 0
        for name in names or sorted(WORKFLOWS):
            code = WORKFLOWS[name]
            for run in Run.objects.filter(workflow__name=name).order_by("-created_at")[:runs]:
                checked += 1
                found = dry_replay(code, run, replay_rows_for_run(run_id=run.id))
                if found is not None:
                    diverging += 1
                    journal, asked = found["journal"], found["code"]
                    said = f"{asked['step_id']} ({asked['kind']})" if asked["step_id"] else "to return"
                    self.stdout.write(
                        f"{run.id} {name}: the journal holds {journal['step_id']} ({journal['kind']}) where the "
                        f"code asks {said}"
                    )
        if diverging:
            self.stderr.write(f"{diverging} of {checked} runs would diverge from the code")
            sys.exit(1)
        self.stdout.write(f"OK: {checked} runs of {len(names or WORKFLOWS)} Python workflows replay against the code")
