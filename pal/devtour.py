"""`make tour`: the README's kill -9 tour on cue, against the `make run` of another terminal.

Starts a run of support-triage, waits until the worker is inside its 20-second `lookup` step, kills the worker's
process group with SIGKILL, then follows the journal until the run ends and checks what the tour promises: the
sweep re-drove it, `draft` ran once, `lookup` ran again under the same key, one email went out. Exit 0 when all hold."""

import os
import signal
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
django.setup()

from django.conf import settings  # noqa: E402  (the settings need django.setup() first)

from journal.models import JournalEvent  # noqa: E402
from pal.devrun import var_dir  # noqa: E402
from runs.models import Run, RunLock, SideEffect, Workflow  # noqa: E402
from runs.services import run_create  # noqa: E402

FINAL = ("succeeded", "failed", "cancelled")


def say(line: str = "") -> None:
    print(line, flush=True)


def worker_pid() -> int:
    """The pid of the worker `make run` started last (the leader of its process group), or exit saying why."""
    path = var_dir() / "worker.pid"
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        sys.exit(f"make tour: no worker of `make run` found ({path}). Start `make run` in another terminal first.")
    return pid


def follow(run_id, after: int, until, timeout: float) -> int:
    """Print the run's new journal rows until until(event) is true or the run ends; return the last seq."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in JournalEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq"):
            after = event.seq
            note = " (resumed: same attempt, same key)" if event.payload.get("resumed") else ""
            if event.kind == "run_redriven":
                note = f"by: {event.payload.get('by')}"
            say(f"    {event.seq:>3}  {event.kind:<22} {event.step_id or ''}{note}")
            if until(event):
                return after
        if Run.objects.filter(id=run_id, status__in=FINAL).exists():
            return after
        time.sleep(0.25)
    sys.exit(f"make tour: nothing happened for {timeout:.0f} s. Is `make run` still going?")


def main() -> None:
    pid = worker_pid()
    if not Workflow.objects.filter(name="support-triage").exists():
        sys.exit("make tour: no workflow support-triage. `make run` loads it from workflows/.")
    run, _ = run_create(
        workflow_name="support-triage", input={"ticket": "printer on fire", "id": 42}, created_by="tour"
    )
    port = os.environ.get("PORT", "8000")
    say(f"\n  started run {run.id}\n  open http://127.0.0.1:{port}/runs/{run.id}/ to watch it (log in as admin)\n")
    say("  waiting until the worker is inside `lookup`, the 20-second step:")
    seq = follow(run.id, 0, lambda e: e.kind == "step_started" and e.step_id == "lookup", timeout=120)
    lock = RunLock.objects.filter(run_id=run.id).first()
    holder = int(lock.owner.rsplit(":", 2)[1]) if lock else None
    pid = worker_pid()  # make run may have started a new worker meanwhile
    try:
        held_by_it = holder is not None and os.getpgid(holder) == pid
    except ProcessLookupError:
        held_by_it = False
    if not held_by_it:
        sys.exit(f"make tour: the run's lease is {lock.owner if lock else 'gone'}, not make run's worker {pid}.")
    os.killpg(pid, signal.SIGKILL)
    wait = settings.PAL_RECOVERY_INTERVAL + settings.PAL_LEASE_TTL
    say(f"\n  killed the worker (kill -9 -- -{pid}: its process group) in the middle of `lookup`.")
    say("  make run starts a new worker, as a supervisor would. Nothing holds the run now; on its page,")
    say("  'why it is not moving' names the dead worker's lease, counting down to its expiry.")
    say(f"  Within PAL_RECOVERY_INTERVAL + PAL_LEASE_TTL (about {wait:.0f} s here) the sweep re-drives it:\n")
    follow(run.id, seq, lambda e: False, timeout=wait + 120)
    run.refresh_from_db()
    started = list(JournalEvent.objects.filter(run_id=run.id, kind="step_started").order_by("seq"))
    lookups = [e for e in started if e.step_id == "lookup"]
    checks = {
        "the run succeeded": run.status == "succeeded",
        "the sweep re-drove it (run_redriven, by: sweep)": JournalEvent.objects.filter(
            run_id=run.id, kind="run_redriven", payload__by="sweep"
        ).exists(),
        "draft, the model call, ran once: reused from the journal": [e.step_id for e in started].count("draft") == 1,
        "lookup ran again under the same attempt and key": len(lookups) == 2 and lookups[1].payload.get("resumed"),
        "one email, sent once": SideEffect.objects.filter(run_id=run.id, channel="email").count() == 1,
    }
    say("")
    for what, held in checks.items():
        say(f"  {'ok ' if held else 'NOT'} {what}")
    say(f"\n  The waterfall on http://127.0.0.1:{port}/runs/{run.id}/ draws the interrupted step, the re-drive and")
    say("  the reused `draft`. The email is a file under var/mail/.")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
