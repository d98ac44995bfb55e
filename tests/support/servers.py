"""Throwaway PostgreSQL and Redis servers on free loopback ports, for `make test` and for tests that must
restart or stop a server (never the shared one others test against).

    start_postgres(tmpdir) -> Postgres   initdb into tmpdir, start; .url, .restart(), .stop(), .start()
    start_redis(tmpdir) -> Redis         no persistence; .url, .stop()

    python -m tests.support.servers run -- CMD ...

starts whatever of the two DATABASE_URL / CELERY_BROKER_URL does not already name, runs CMD with both set,
then stops them and deletes the temp folder, whatever CMD did (failure, Ctrl-C, SIGTERM). A server that
cannot be started is an error (exit 1 with the tail of its log): the suite must never run, or skip, without it.

Postgres refuses to run as root, so as root the cluster runs as the user `postgres` (`runuser`). Its role `pal`
is a superuser of the throwaway cluster, so pytest-django can create and drop its test databases.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USER = "pal"
PASSWORD = "pal"
DATABASE = "pal"
PG_BINDIRS = ("/usr/lib/postgresql/15/bin", *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
READY_TIMEOUT = 60.0


class ServerError(RuntimeError):
    """A server could not be started (or stopped); the message says which and shows its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- PostgreSQL ------------------------------------------------------------------------------------


def pg_bindir() -> Path:
    for candidate in PG_BINDIRS:
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServerError(
        "PostgreSQL is not installed: no initdb in /usr/lib/postgresql/*/bin or on PATH (apt-get install postgresql)"
    )


def _as_root() -> bool:
    return os.geteuid() == 0


def _pg_owned_dir(tmpdir: Path) -> tuple[Path, bool]:
    """A folder the cluster's user can own: tmpdir/pg, or as root, when `postgres` cannot reach tmpdir (pytest's
    tmp_path sits under a 0700 folder of root's), a folder of its own in the system temp dir.
    Returns (folder, whether stop() must delete it)."""
    folder = tmpdir / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    if not _as_root():
        return folder, False
    import pwd

    entry = pwd.getpwnam("postgres")
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    reachable = (
        subprocess.run(
            ["runuser", "-u", "postgres", "--", "test", "-w", str(folder)], cwd="/", capture_output=True
        ).returncode
        == 0
    )
    if reachable:
        return folder, False
    folder.rmdir()
    folder = Path(tempfile.mkdtemp(prefix="pal-pg-"))
    os.chmod(folder, 0o700)
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    return folder, True


class Postgres:
    """A PostgreSQL cluster of our own. ``url`` is a DATABASE_URL for the database ``pal``."""

    def __init__(self, root: Path, port: int, *, remove_root: bool, durable: bool = False):
        self.durable = durable  # fsync and synchronous commits on, as in production (what `make bench` measures)
        self.root = root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = port
        self.bindir = pg_bindir()
        self._remove_root = remove_root

    def __repr__(self):
        return f"<Postgres 127.0.0.1:{self.port} {self.data}>"

    @property
    def url(self) -> str:
        return self.url_for(DATABASE)

    def url_for(self, database: str) -> str:
        return f"postgres://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if _as_root():
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # Own session: a Ctrl-C at the terminal reaches us (who stop the server cleanly), not the server.
        done = subprocess.run(
            cmd,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if check and done.returncode != 0:
            raise ServerError(
                f"{args[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}\n"
                f"postgres log:\n{_tail(self.log)}"
            )
        return done

    def initdb(self):
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if _as_root():
            shutil.chown(pwfile, "postgres")
        try:
            # trust over the socket (only the cluster's user reaches it), passwords over TCP like production.
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# throwaway test cluster (tests/support/servers.py)\n"
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                # The integration tests start many worker processes, each with its own connections.
                "max_connections = 200\n"
            )
            if not self.durable:
                # Nothing here outlives the test session: skip the disk flushes (a killed server process still
                # loses nothing, since the OS keeps the written pages).
                conf.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")

    def start(self):
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(READY_TIMEOUT)), "start")
        self._wait_ready()

    def stop(self, mode: str = "fast"):
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast"):
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(READY_TIMEOUT)),
            "restart",
        )
        self._wait_ready()

    def _wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            done = self._run("pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port), check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"PostgreSQL on 127.0.0.1:{self.port} not ready after {READY_TIMEOUT:.0f}s:\n{_tail(self.log)}"
                )
            time.sleep(0.1)

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = self._run(
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(self.root),
            "-p",
            str(self.port),
            "-U",
            USER,
            "-d",
            database,
            "-tAc",
            sql,
        )
        return done.stdout.strip()

    def create_database(self, name: str):
        self.psql(f'CREATE DATABASE "{name}" OWNER {USER}')

    def destroy(self):
        """Stop the server (immediately) and delete its folder."""
        try:
            self.stop(mode="immediate")
        finally:
            shutil.rmtree(self.data, ignore_errors=True)
            if self._remove_root:
                shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(tmpdir: str | Path, *, durable: bool = False) -> Postgres:
    """initdb a cluster under ``tmpdir`` and start it on a free port of 127.0.0.1, with a database ``pal``;
    durable: with fsync and synchronous commits, as production runs (else both off, for speed)."""
    pg_bindir()  # not installed: say so before making folders
    root, remove_root = _pg_owned_dir(Path(tmpdir))
    server = Postgres(root, free_port(), remove_root=remove_root, durable=durable)
    try:
        server.initdb()
        server.start()
        server.create_database(DATABASE)
    except BaseException:
        server.destroy()
        raise
    return server


# --- Redis -----------------------------------------------------------------------------------------


class Redis:
    """A redis-server of our own, no persistence. ``url`` is a CELERY_BROKER_URL for its db 0."""

    def __init__(self, root: Path, port: int):
        self.root = root
        self.port = port
        self.log = root / "redis.log"
        self.proc: subprocess.Popen | None = None

    def __repr__(self):
        return f"<Redis 127.0.0.1:{self.port}>"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        binary = shutil.which("redis-server")
        if not binary:
            raise ServerError("redis-server is not installed (apt-get install redis-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.root),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                str(self.log),
                "--daemonize",
                "no",
            ],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._answers():
            if self.proc.poll() is not None:
                raise ServerError(f"redis-server exited with {self.proc.returncode}:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"redis-server on 127.0.0.1:{self.port} not ready after {READY_TIMEOUT:.0f}s")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def start_redis(tmpdir: str | Path) -> Redis:
    server = Redis(Path(tmpdir) / "redis", free_port())
    server.start()
    return server


# --- python -m tests.support.servers run -- CMD ----------------------------------------------------


class _Stop(Exception):
    """SIGTERM or SIGHUP: unwind like Ctrl-C, so the finally below stops the servers."""


def _stop_on_signal(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def _stop_child(child: subprocess.Popen | None, forward: int | None):
    if child is None or child.poll() is not None:
        return
    if forward is not None:  # a Ctrl-C at the terminal reached the child's process group already
        child.send_signal(forward)
    try:
        child.wait(60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def run(cmd: list[str]) -> int:
    env = dict(os.environ)
    need_db = not env.get("DATABASE_URL")
    need_broker = not env.get("CELERY_BROKER_URL")
    if not (need_db or need_broker):
        print("servers: using DATABASE_URL and CELERY_BROKER_URL from the environment; starting nothing", flush=True)
        return subprocess.call(cmd)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGHUP, _stop_on_signal)
    tmpdir = Path(tempfile.mkdtemp(prefix="pal-test-servers-"))
    os.chmod(tmpdir, 0o755)  # as root the cluster's user `postgres` must reach tmpdir/pg
    stops = []  # how to stop what was started, newest first
    child = None
    try:
        if need_db:
            postgres = start_postgres(tmpdir, durable=env.get("PAL_SERVERS_DURABLE") == "1")
            stops.insert(0, (postgres, postgres.destroy))
            env["DATABASE_URL"] = postgres.url
            print(f"servers: throwaway PostgreSQL on 127.0.0.1:{postgres.port} ({postgres.data})", flush=True)
        if need_broker:
            redis = start_redis(tmpdir)
            stops.insert(0, (redis, redis.stop))
            env["CELERY_BROKER_URL"] = redis.url
            print(f"servers: throwaway Redis on 127.0.0.1:{redis.port}", flush=True)
        child = subprocess.Popen(cmd, env=env)
        return child.wait()
    except (ServerError, OSError, subprocess.SubprocessError) as exc:
        print(f"servers: FAILED: could not start the throwaway servers: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        _stop_child(child, None)
        print("servers: interrupted", file=sys.stderr, flush=True)
        return 130
    except _Stop as exc:
        _stop_child(child, signal.SIGTERM)
        print(f"servers: stopped by {exc}", file=sys.stderr, flush=True)
        return 143
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        for server, stop in stops:
            try:
                stop()
            except Exception as exc:
                print(f"servers: could not stop {server}: {exc}", file=sys.stderr, flush=True)
        shutil.rmtree(tmpdir, ignore_errors=True)
        if stops:
            print("servers: stopped the throwaway servers and deleted " + str(tmpdir), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "run" or argv[1] != "--":
        print("usage: python -m tests.support.servers run -- CMD [ARGS...]", file=sys.stderr)
        return 2
    return run(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
