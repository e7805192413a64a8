"""Shared test setup: no test writes outside its tmp_path, Ray never writes ~/.ray, and tiny
models are compiled once per session."""

import os
import signal
import tempfile

# Tests Ctrl-C runners with SIGINT. A suite started in the background by a non-interactive shell
# (`nohup make test &`) inherits SIGINT ignored, and an ignored signal stays ignored across exec:
# every runner a test starts would ignore its Ctrl-C (Python installs its KeyboardInterrupt
# handler only where SIGINT is not ignored at start). A handler here is reset to the default in
# each child at exec, so the children start as they would from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Local input hashes (steps.data.sources) are cached here, not under ~/.cache.
os.environ.setdefault("DRYDOCK_CACHE_DIR", tempfile.mkdtemp(prefix="drydock-test-cache-"))
# JAX's persistent compilation cache, shared by every process the tests start (a training's
# `drydock run`, each host of a gang, Ray workers): dozens of tests train the same tiny models,
# and compiling them was most of each training's time (a 40-step tiny training: 35 s cold, 14 s
# with the cache). A cache hit runs the very executable compiled before: losses stay bit for bit
# (checked). Fresh per session, so CI starts cold like any user.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="drydock-test-jax-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


import pytest

from tests.webhook import webhook_server


@pytest.fixture
def webhook():
    """A webhook on 127.0.0.1: (its URL, the requests it got)."""
    with webhook_server() as hook:
        yield hook
