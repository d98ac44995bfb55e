"""How the pages write a duration (runs.pages.formatting.duration_text): one format, rounded once at the unit shown."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from runs.pages.formatting import clock, delta_text, duration_text, usd


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 ms"),
        (0.8404, "840 ms"),
        (0.9996, "1.0 s"),  # not "1000 ms"
        (1.5, "1.5 s"),
        (12.34, "12.3 s"),
        (59.96, "1 min 0 s"),  # not "60.0 s"
        (125, "2 min 5 s"),
        (3599.6, "1 h 0 min"),  # not "59 min 60 s"
        (3 * 3600 + 20 * 60, "3 h 20 min"),
        (2 * 86400 + 4 * 3600 + 59, "2 d 4 h"),
        (-0.2, "0 ms"),  # two hosts' clocks a little apart
    ],
)
def test_a_duration_reads_in_the_largest_sensible_unit(seconds, text):
    assert duration_text(seconds) == text


def test_a_timedelta_reads_as_its_seconds_do():
    assert delta_text(timedelta(milliseconds=1500)) == duration_text(1.5) == "1.5 s"


def test_a_clock_time_is_utc_to_the_millisecond_and_none_is_a_dash():
    moment = datetime(2025, 3, 1, 14, 0, 1, 250_000, tzinfo=timezone(timedelta(hours=2)))
    assert clock(moment) == "12:00:01.250"
    assert clock(datetime(2025, 3, 1, 12, 0, 1, tzinfo=UTC)) == "12:00:01.000"
    assert clock(None) == "—"


def test_money_below_a_cent_keeps_its_digits():
    assert (usd(0), usd("0.00042"), usd(1234.56)) == ("$0", "$0.00042", "$1,234.5600")
