"""Shared test setup: no test writes outside its tmp_path, and Ray never writes ~/.ray."""

import os
import tempfile

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Local input hashes (steps.sources) are cached here, not under ~/.cache.
os.environ.setdefault("DRYDOCK_CACHE_DIR", tempfile.mkdtemp(prefix="drydock-test-cache-"))


import pytest

from tests.webhook import webhook_server


@pytest.fixture
def webhook():
    """A webhook on 127.0.0.1: (its URL, the requests it got)."""
    with webhook_server() as hook:
        yield hook
