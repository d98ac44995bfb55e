"""docs/tutorial.md works as written: its commands, run in order in one shell against a real `make run` (SQLite
under a temp folder, a real worker), load its workflow, start its runs, reach its approvals, and finish them after
the approvals it gives. Its ```json blocks are mine/ticket-digest.json, its ```python block mine/tools.py; a
```sh block that runs `make run` (re)starts it with the variables the line sets."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from queue import Empty, Queue

import pytest

from tests.support.makerun import MakeRun

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
FILES = {"json": "mine/ticket-digest.json", "python": "mine/tools.py"}
BLOCK = re.compile(r"^```(sh|json|python)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
OPEN = ("queued", "running")


def blocks() -> list[tuple[str, str]]:
    return [(kind, body) for kind, body in BLOCK.findall(TUTORIAL)]


class Shell:
    """One bash, as the reader's second terminal: variables set by one block are there for the next."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: Queue[str] = Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.run("set -o pipefail")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # bash is gone

    def run(self, script: str, timeout: float = 120) -> str:
        """Run script; its output, once it ends with status 0 (else the test fails with the output)."""
        assert self.proc.stdin is not None
        # A command's output may not end its last line (curl's JSON does not): the marker starts a line of its own.
        self.proc.stdin.write(f'{script}\nstatus=$?; echo; echo "@@done $status"\n')
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except Empty:
                raise AssertionError(f"no end after {timeout} s:\n{script}\n--- output:\n{''.join(out)}") from None
            if line.startswith("@@done "):
                assert line.split()[1] == "0", f"status {line.split()[1]}:\n{script}\n--- output:\n{''.join(out)}"
                return "".join(out)
            assert line, f"the shell ended:\n{script}\n--- output:\n{''.join(out)}"
            out.append(line)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # bash ends at the end of its input
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.proc.stdout.close()


def settle(make_run: MakeRun, timeout: float = 120) -> None:
    """Wait until no run of ticket-digest is queued or running: each has succeeded, failed or waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = make_run.query(
            "SELECT r.status FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE w.name = 'ticket-digest'"
        )
        if not any(status in OPEN for (status,) in rows):
            return
        time.sleep(0.3)
    raise AssertionError(f"runs of ticket-digest still open after {timeout} s:\n{make_run.tail()}")


def restart(make_run: MakeRun, command: str) -> None:
    """A block that runs `make run`: Ctrl-C the one going, then start it with the variables the line sets."""
    words = shlex.split(command.strip())
    assert words[-2:] == ["make", "run"], command
    more = dict(word.split("=", 1) for word in words[:-2])
    make_run.stop()
    make_run.start(**more)


@pytest.mark.integration
def test_the_tutorial_runs_as_written(tmp_path):
    make_run = MakeRun(tmp_path)
    shell = Shell(make_run.checkout, make_run.env())
    address = f"127.0.0.1:{make_run.port}"
    try:
        for kind, body in blocks():
            if kind != "sh":
                path = make_run.checkout / FILES[kind]
                path.write_text(body)
                continue
            if body.strip().endswith("make run"):
                restart(make_run, body)
                continue
            shell.run(body.replace("127.0.0.1:8000", address))
            settle(make_run)
        runs = make_run.query(
            "SELECT r.status, r.output, w.version FROM runs r JOIN workflows w ON w.id = r.workflow_id "
            "WHERE w.name = 'ticket-digest' ORDER BY r.created_at"
        )
        decided = make_run.query("SELECT COUNT(*) FROM journal_events WHERE kind = 'approval_decided'")[0][0]
    finally:
        shell.close()
        make_run.stop()

    assert [status for status, _, _ in runs] == ["succeeded"] * 6, (runs, make_run.tail())
    assert [version for _, _, version in runs] == [1, 1, 2, 3, 4, 5]
    assert decided == 3  # steps 7, 8 and 9 each approve their run as the tutorial says
    output = json.loads(runs[-1][1])
    assert [t["priority"] for t in output["tickets"]] == ["high", "low", "high"]
    assert output["summary"].startswith("[fake gpt-4o-mini")


def test_the_tutorial_names_the_files_its_blocks_are():
    kinds = [kind for kind, _ in blocks()]
    assert kinds.count("json") == 5 and kinds.count("python") == 1
    for path in FILES.values():
        assert f"`{path}`" in TUTORIAL
    assert "ticket-digest" in TUTORIAL and "support-triage" not in TUTORIAL  # the tour's workflow stays the tour's
    assert "127.0.0.1:9000" not in TUTORIAL  # nothing listens there: every example runs offline
