import sys

from django.core.management.base import BaseCommand, CommandError

from journal.selectors import replay_rows_for_run
from runs.code import WORKFLOWS
from runs.models import FINAL_STATUSES, Run
from runs.walk.code import dry_replay


class Command(BaseCommand):
    help = (
        "pal_check_workflows [NAME ...] [--recent N | --all]: replay the journals of the live runs (queued, running, "
        "waiting) of each Python workflow (all, or those named) against the code as it is now, calling nothing. "
        "Exit 1 with one line per live run that would diverge (its id, the step its journal holds and the one the "
        "code asks for), else 0. --recent N also checks the N most recent ended runs of each, --all every ended "
        "run: those are listed, marked ended, and never make the exit status 1 (they replay only if retried)."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME")
        ended = parser.add_mutually_exclusive_group()
        ended.add_argument("--recent", type=int, default=0, metavar="N", help="also the N latest ended runs of each")
        ended.add_argument("--all", action="store_true", help="also every ended run")

    def handle(self, *args, names=(), recent=0, all=False, **options):
        unknown = [name for name in names if name not in WORKFLOWS]
        if unknown:
            known = ", ".join(sorted(WORKFLOWS)) or "none is loaded (PAL_WORKFLOW_MODULES, an app's workflows.py)"
            raise CommandError(f"not a Python workflow: {', '.join(unknown)}; the Python workflows: {known}")
        if recent < 0:
            raise CommandError("--recent must be 0 or more")
        live_diverging = ended_diverging = checked = 0
        for name in names or sorted(WORKFLOWS):
            for run in runs_to_check(name, recent=None if all else recent):
                checked += 1
                found = dry_replay(WORKFLOWS[name], run, replay_rows_for_run(run_id=run.id))
                if found is None:
                    continue
                journal, asked = found["journal"], found["code"]
                said = f"{asked['step_id']} ({asked['kind']})" if asked["step_id"] else "to return"
                held = f"{journal['step_id']} ({journal['kind']})"
                line = f"{run.id} {name}: the journal holds {held} where the code asks {said}"
                if run.status in FINAL_STATUSES:
                    ended_diverging += 1
                    line += f" (ended {run.status} on version {run.workflow.version}: not an error)"
                else:
                    live_diverging += 1
                self.stdout.write(line)
        if ended_diverging:
            self.stderr.write(f"{ended_diverging} ended runs would diverge from the code (they replay only if retried)")
        if live_diverging:
            self.stderr.write(f"{live_diverging} of {checked} runs checked are live and would diverge from the code")
            sys.exit(1)
        workflows = len(names or WORKFLOWS)
        self.stdout.write(f"OK: {checked} runs of {workflows} Python workflows checked; no live run diverges")


def runs_to_check(name: str, *, recent: int | None):
    """The live runs of the workflow, oldest first, then its ended ones: the `recent` latest (every one when None)."""
    runs = Run.objects.filter(workflow__name=name).select_related("workflow")
    yield from runs.exclude(status__in=FINAL_STATUSES).order_by("created_at").iterator()
    ended = runs.filter(status__in=FINAL_STATUSES).order_by("-created_at")
    if recent is None:
        yield from ended.iterator()
    elif recent:
        yield from ended[:recent]
