"""Processes whose clock disagrees with the host's: libfaketime (Debian's `faketime` package) preloaded with an
offset, the monotonic clock faked too (Python's time.sleep fails under libfaketime otherwise), and a small wrapper
of sem_clockwait that libfaketime lacks (tests/support/sem_clockwait.c, built once with the system's C compiler).
scripts/system-deps.sh installs both under `make test`."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@functools.cache
def _libraries() -> str:
    found = sorted(
        glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + glob.glob("/usr/lib/faketime/libfaketimeMT.so.1")
    )
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not found or compiler is None:
        pytest.fail(
            "this test needs libfaketime and a C compiler: apt-get install faketime gcc (make test does, as root)",
            pytrace=False,
        )
    built = Path(tempfile.gettempdir()) / "pal-tests-sem-clockwait.so"
    if not built.exists() or built.stat().st_mtime < (HERE / "sem_clockwait.c").stat().st_mtime:
        scratch = built.with_suffix(f".{os.getpid()}.so")
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(scratch), str(HERE / "sem_clockwait.c")], check=True
        )
        scratch.replace(built)
    return f"{built}:{found[0]}"


def skewed(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall and monotonic clocks read `seconds` off the host's (+ ahead)."""
    return {
        "LD_PRELOAD": _libraries(),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "0",
    }
