"""Shared test setup: no test writes outside its tmp_path, and Ray never writes ~/.ray."""

import os
import tempfile

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Local input hashes (steps.sources) are cached here, not under ~/.cache.
os.environ.setdefault("DRYDOCK_CACHE_DIR", tempfile.mkdtemp(prefix="drydock-test-cache-"))
