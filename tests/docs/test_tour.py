"""`make tour` does the README's kill -9 tour on cue against a real `make run`: it kills the worker's process group
inside `lookup`, and the run it started recovers as the README says (re-driven by the sweep, the model call reused,
`lookup` again under its key, one email)."""

import subprocess
import sys

import pytest

from tests.support.makerun import ROOT, MakeRun


@pytest.mark.integration
def test_make_tour_kills_the_worker_inside_lookup_and_the_run_recovers(tmp_path):
    make_run = MakeRun(tmp_path)
    make_run.start()
    try:
        worker = int((make_run.var / "worker.pid").read_text())
        tour = subprocess.run(
            [sys.executable, "-m", "pal.devtour"],
            cwd=ROOT,
            env=make_run.env(PORT=str(make_run.port), PAL_RECOVERY_INTERVAL="5", PAL_LEASE_TTL="10"),
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        make_run.stop()
    assert tour.returncode == 0, tour.stdout + tour.stderr
    assert f"kill -9 -- -{worker}" in tour.stdout
    assert "NOT" not in tour.stdout
    for promise in ("the sweep re-drove it", "draft, the model call, ran once", "one email, sent once"):
        assert f"ok  {promise}" in tour.stdout


def test_make_tour_without_make_run_says_to_start_it(tmp_path):
    tour = subprocess.run(
        [sys.executable, "-m", "pal.devtour"],
        cwd=ROOT,
        env=MakeRun(tmp_path).env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tour.returncode == 1
    assert "Start `make run` in another terminal first" in tour.stderr
