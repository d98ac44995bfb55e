"""A date filter's text as runs.search reads it: in UTC, or a refusal naming the filter (issue 23, section 7)."""

from datetime import UTC, datetime

import pytest

from runs import search


def test_a_moment_with_a_zone_is_read_in_utc():
    berlin = search.moment("2026-12-01T13:40:00+02:00", field="created_after")
    assert berlin == datetime(2026, 12, 1, 11, 40, tzinfo=UTC)
    assert search.moment("2026-12-01", field="created_after") == datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize("text", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_a_moment_past_the_last_utc_date_time_is_refused_naming_the_filter(text):
    with pytest.raises(search.InvalidFilter, match=r"^created_before: .* is outside the date-times"):
        search.moment(text, field="created_before")
