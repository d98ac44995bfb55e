"""make test's shards (tests/support/shards.py): every test file in exactly one shard, the shards about equal by
durations.json, the SQLite pass in one of them, and one shard when the servers are given."""

import json

from tests.support import shards


def test_every_file_is_in_one_shard_and_the_shards_are_about_equal():
    durations = json.loads(shards.DURATIONS.read_text())
    files = shards.test_files()
    split = shards.split(files, durations, 2)
    assert sorted(f for shard in split for f in shard) == files
    loads = [sum(durations.get(f, shards.DEFAULT_SECONDS) for f in shard) for shard in split]
    loads[-1] += shards.SQLITE_SECONDS
    biggest = max(durations.get(f, shards.DEFAULT_SECONDS) for f in files)
    assert abs(loads[0] - loads[1]) <= biggest, loads


def test_the_last_shard_runs_the_sqlite_pass_first_and_each_its_own_servers():
    cmds = shards.commands("python", [["tests/a/test_x.py"], ["tests/b/test_y.py"]])
    first, last = (cmd[-1] for cmd in cmds)
    assert all(cmd[1:4] == ["-m", "tests.support.servers", "run"] for cmd in cmds)
    assert "-u DATABASE_URL" not in first and "tests/a/test_x.py" in first
    assert last.index("make --no-print-directory test-sqlite") < last.index("tests/b/test_y.py")


def test_the_servers_given_make_one_shard(monkeypatch):
    monkeypatch.setenv("PAL_TEST_SHARDS", "2")
    monkeypatch.setenv("DATABASE_URL", "postgres://pal:pal@127.0.0.1:5432/pal")
    assert shards.shard_count() == 1
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    assert shards.shard_count() == 2
