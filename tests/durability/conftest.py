import pytest

from tests.helpers import LEASE_TTL


@pytest.fixture(autouse=True)
def _lease_ttl(settings):
    """The test process's lease TTL is the workers' (tests.conftest.worker_env), so its sweeps agree with them."""
    settings.PAL_LEASE_TTL = LEASE_TTL
