"""A streaming standby of a throwaway Postgres (tests/support/servers.py), synchronous: a commit returns once the
standby has it too, so the standby promoted after the primary died holds every commit a client saw.

    start_standby(tmpdir, primary) -> Postgres   pg_basebackup -R of `primary`, started, primary waits for it
    kill_postmaster(server)                      SIGKILL the postmaster (a crashed host); destroy() then deletes it
    promote(server)                              pg_ctl promote, and wait until it accepts writes
    multi_host_url(*servers)                     postgres://pal:pal@h1:p1,h2:p2/pal?target_session_attrs=read-write
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.support.servers import (
    DATABASE,
    PASSWORD,
    READY_TIMEOUT,
    USER,
    Postgres,
    ServerError,
    _pg_owned_dir,
    free_port,
)


def start_standby(tmpdir: str | Path, primary: Postgres) -> Postgres:
    """A hot standby of `primary` on a free port, streaming from it; the primary's commits wait for it."""
    root, remove_root = _pg_owned_dir(Path(tmpdir) / "standby")
    standby = Postgres(root, free_port(), remove_root=remove_root)
    try:
        source = f"host=127.0.0.1 port={primary.port} user={USER} password={PASSWORD}"
        standby._run("pg_basebackup", "-D", str(standby.data), "-d", source, "-R", "-X", "stream", "-c", "fast")
        with open(standby.data / "postgresql.conf", "a") as conf:
            # Its own port and socket (the copy has the primary's), and no synchronous standby of its own: once
            # promoted it is alone, and a commit waiting for a standby that never comes would hang.
            conf.write(
                f"\n# standby (tests/support/standby.py)\nport = {standby.port}\n"
                f"unix_socket_directories = '{standby.root}'\nsynchronous_standby_names = ''\nhot_standby = on\n"
            )
        standby.start()
        # Synchronous from now on: a commit on the primary returns once the standby has flushed it.
        primary.psql("ALTER SYSTEM SET synchronous_commit = 'on'")
        primary.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.psql("SELECT pg_reload_conf()")
        _wait(
            lambda: primary.psql("SELECT sync_state FROM pg_stat_replication") == "sync",
            what=f"{standby} streaming synchronously from {primary}",
        )
    except BaseException:
        standby.destroy()
        raise
    return standby


def kill_postmaster(server: Postgres) -> None:
    """SIGKILL the postmaster, as a host that crashed; its backends see it gone and exit. destroy() then only
    deletes the folder."""
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not _alive(pid), what=f"{server}'s postmaster {pid} to die")
    (server.data / "postmaster.pid").unlink()  # nothing is running: destroy() must not ask pg_ctl to stop it


def promote(server: Postgres) -> None:
    server._run("pg_ctl", "-D", str(server.data), "-w", "-t", str(int(READY_TIMEOUT)), "promote")
    _wait(lambda: server.psql("SELECT pg_is_in_recovery()") == "f", what=f"{server} to accept writes")


def multi_host_url(*servers: Postgres) -> str:
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return f"postgres://{USER}:{PASSWORD}@{hosts}/{DATABASE}?target_session_attrs=read-write"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too; pg_ctl started it, so it is not ours to reap.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait(predicate, *, what: str, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise ServerError(f"waited {timeout:.0f}s for {what}, in vain")
        time.sleep(0.05)
