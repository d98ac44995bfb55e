"""agent: an in-VM agent run as a subprocess (docs/reference/workflows.md, agent)."""

# The step's rendered input goes to the agent's stdin as JSON; one JSON object on its stdout is the output.
# Environment (an allowlist, agent_env): PATH, HOME, LANG, TMPDIR, the variables PAL_AGENT_ENV names, PAL_RUN_ID,
# PAL_STEP_ID, PAL_IDEMPOTENCY_KEY, and PAL_RESUME=1 when this attempt had already started before a crash; never
# a secret of the engine. stderr lines that are JSON objects with a "pal_event" field become journal events of
# that kind (reserved kinds are refused). Everything journaled from the agent is masked first (runs.secrets). The
# agent runs in its own process group, which is killed on a timeout, on a lost lease (a steal or a cancel) and,
# through PR_SET_PDEATHSIG, when the worker itself dies.

import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
import time

from django.conf import settings

from journal.models import RESERVED_KINDS

from ..errors import LeaseLost, StepError
from .base import StepKind, register, run_masked

PR_SET_PDEATHSIG = 1
STDERR_TAIL = 2000


_LIBC: ctypes.CDLL | None
try:  # loaded once here: loading a library in the forked child, with other threads alive, can hang it
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None  # not Linux: the group is still killed on a timeout and a lost lease


def _preexec_for(parent_pid: int):
    def own_group_and_die_with_parent():
        os.setsid()
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(137)  # the worker died between the fork and prctl: do not run orphaned

    return own_group_and_die_with_parent


def _kill_group(proc: subprocess.Popen):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# What every agent gets from the worker's environment, when the worker has it (docs/reference/keys.md).
BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")


def agent_env(ctx) -> dict[str, str]:
    """The agent's whole environment, built from an allowlist: BASE_ENV, the names in PAL_AGENT_ENV, and the
    engine's own PAL_RUN_ID, PAL_STEP_ID, PAL_IDEMPOTENCY_KEY and PAL_RESUME (set last, so the worker's values
    of those never leak through). Nothing else of the worker's environment (its database and broker URLs,
    keys and passwords) reaches someone else's code."""
    names = [*BASE_ENV, *settings.PAL_AGENT_ENV]
    env = {
        name: os.environ[name] for name in names if name in os.environ and name not in settings.ENGINE_SECRET_NAMES
    }  # settings refuses those too
    env.pop("PAL_RESUME", None)
    env.update({"PAL_RUN_ID": ctx.run_id, "PAL_STEP_ID": ctx.step_id, "PAL_IDEMPOTENCY_KEY": ctx.key})
    if ctx.resumed:
        env["PAL_RESUME"] = "1"
    return env


@register
class Agent(StepKind):
    kind = "agent"
    required = ("agent",)
    optional = ("input",)
    templated = ("input",)

    def validate(self, step):
        name = step.get("agent")
        if not isinstance(name, str) or not name:
            return [("agent", "must be the name of an agent configured in PAL_AGENTS")]
        if name not in settings.PAL_AGENTS:
            return [
                ("agent", f"unknown agent {name!r}; configured: {', '.join(sorted(settings.PAL_AGENTS)) or 'none'}")
            ]
        if "input" in step and not isinstance(step["input"], dict):
            return [("input", "must be an object")]
        return []

    def run(self, step, ctx):
        # Its stdout, stderr tail, events and errors are journaled: masked, should a secret have reached it.
        return run_masked(self.run_agent, step, ctx)

    def run_agent(self, step, ctx):
        name = step["agent"]
        command = settings.PAL_AGENTS.get(name)
        if not command:
            raise StepError(f"unknown agent {name!r}", code="unknown_agent")
        env = agent_env(ctx)
        timeout = ctx.timeout or settings.PAL_AGENT_TIMEOUT
        proc = _start(command, env, name)
        pipes = _Pipes(proc)
        _feed(proc, step.get("input") or {})
        refused: list[str] = []
        self._watch(proc, pipes.events, ctx, name, timeout, refused)
        pipes.join()
        self._drain(pipes.events, ctx, refused)
        return _output_of(proc, pipes, name)

    def _watch(self, proc: subprocess.Popen, events: queue.Queue, ctx, name: str, timeout: float, refused: list):
        """Journal the agent's events until it exits; kill its group on a lost lease or a timeout (raised)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._drain(events, ctx, refused)
                if proc.poll() is not None:
                    break
                if ctx.lease_lost():
                    raise LeaseLost(f"lease lost while agent {name!r} ran")
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    # Definite: the step's time budget is spent (issue 3: a clear step_failed). Not an unknown
                    # outcome to run again under the same key; a workflow that wants another go sets retry.
                    raise StepError(
                        f"agent {name!r} timed out after {timeout:g}s; its process group was killed",
                        code="agent_timeout",
                        permanent=True,
                    )
                time.sleep(0.05)
        except BaseException:
            if proc.poll() is None:
                _kill_group(proc)
            raise
        finally:
            # Whatever the agent left in its group (children it spawned) goes too.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _drain(self, events: queue.Queue, ctx, refused: list):
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                return
            kind = event.pop("pal_event")
            if kind in RESERVED_KINDS or not kind:
                refused.append(kind)
                ctx.emit("agent_event_refused", {"kind": kind, "reason": "reserved for the engine"})
                continue
            ctx.emit(kind[:64], event)


def _start(command, env: dict[str, str], name: str) -> subprocess.Popen:
    """The agent's process, in a group of its own that dies with this worker, its three pipes open."""
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_preexec_for(os.getpid()),
            close_fds=True,
        )
    except OSError as exc:
        raise StepError(f"agent {name!r} could not start: {exc}", code="agent_start_failed") from None


def _feed(proc: subprocess.Popen, value: dict) -> None:
    assert proc.stdin is not None  # a PIPE
    try:
        with proc.stdin:  # closed even when the agent exited without reading it (the write or flush fails)
            proc.stdin.write(json.dumps(value).encode())
    except BrokenPipeError:
        pass


def _event_of(line: str) -> dict | None:
    """A stderr line that is a JSON object with a "pal_event" string, or None (a line of the tail)."""
    if not line.startswith("{"):
        return None
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and isinstance(parsed.get("pal_event"), str) else None


class _Pipes:
    """Two threads reading the agent's stdout whole and its stderr by line: events to a queue, other lines to a
    tail of the last 40."""

    def __init__(self, proc: subprocess.Popen):
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None and stderr is not None  # both are PIPEs
        self.events: queue.Queue = queue.Queue()
        self.stdout_chunks: list[bytes] = []
        self.stderr_tail: list[str] = []
        self.readers = [
            threading.Thread(target=self.read_stdout, args=(stdout,), daemon=True),
            threading.Thread(target=self.read_stderr, args=(stderr,), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    # Each reader closes its pipe at end of file (the agent exited or its group was killed), whichever way
    # the step ends: no pipe is left for the garbage collector.
    def read_stdout(self, stdout) -> None:
        with stdout:
            self.stdout_chunks.append(stdout.read())

    def read_stderr(self, stderr) -> None:
        with stderr:
            for raw in stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                event = _event_of(line)
                if event is not None:
                    self.events.put(event)
                else:
                    self.stderr_tail.append(line)
                    del self.stderr_tail[:-40]

    def join(self) -> None:
        for reader in self.readers:
            reader.join(timeout=5)

    def tail(self) -> str:
        return "\n".join(self.stderr_tail)[-STDERR_TAIL:]

    def stdout(self) -> str:
        return b"".join(self.stdout_chunks).decode("utf-8", "replace").strip()


def _output_of(proc: subprocess.Popen, pipes: _Pipes, name: str) -> dict:
    """The agent's output: the one JSON object it printed, once it exited with status 0."""
    tail = pipes.tail()
    if proc.returncode != 0:
        raise StepError(
            f"agent {name!r} exited with status {proc.returncode}",
            code="agent_failed",
            details={"exit_status": proc.returncode, "stderr": tail},
        )
    raw = pipes.stdout()
    output = _one_object(raw)
    if output is None:
        raise StepError(
            f"agent {name!r} did not print one JSON object on stdout",
            code="agent_bad_output",
            details={"stdout": raw[:500], "stderr": tail},
        )
    return output


def _one_object(raw: str):
    for candidate in (raw, raw.splitlines()[-1] if raw else ""):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
