"""A Google Cloud VM's maintenance or preemption, read from its metadata server, as a preemption
notice (`steps.training.preemption`).

A GCE VM (a GPU host, a TPU VM) learns of what is coming from its metadata server before it
happens: `instance/maintenance-event` turns to `TERMINATE_ON_HOST_MAINTENANCE` (TPU VMs and GPU
hosts cannot live-migrate: the VM will be stopped, typically 60 s later for GPUs), and
`instance/preempted` to `TRUE` on a spot or preemptible VM (30 s before it is stopped, when
SIGTERM also comes). While a training runs on such a VM, a thread long-polls both
(`?wait_for_change=true`); either value is taken as a notice, exactly like SIGTERM: the gang saves
the step in hand and the attempt ends PREEMPTED, to resume from it. `MIGRATE_ON_HOST_MAINTENANCE`
is not a notice: the VM keeps running.

The server is `http://metadata.google.internal/computeMetadata/v1`, asked only on a Google Cloud
VM (its DMI product name says "Google"); `$DRYDOCK_GCE_METADATA_URL` names another (tests use a
server on loopback) and makes the watch run anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

__all__ = ["METADATA_URL", "NOTICES", "on_google_cloud", "watching"]

logger = logging.getLogger(__name__)

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
URL_ENV = "DRYDOCK_GCE_METADATA_URL"
NOTICES = {
    "instance/maintenance-event": ("TERMINATE_ON_HOST_MAINTENANCE",),
    "instance/preempted": ("TRUE",),
}
"""The metadata keys watched, and the values that announce the VM's end."""
RETRY_SECONDS = 1.0


def on_google_cloud() -> bool:
    """Whether this machine is a Google Cloud VM (what its DMI product name says)."""
    try:
        with open("/sys/class/dmi/id/product_name") as f:
            return "Google" in f.read()
    except OSError:
        return False


def _watch(base: str, key: str, notice: Callable[[str], None], stop: threading.Event) -> None:
    """Long-poll `key` until it announces the VM's end (then `notice` it, once) or `stop`."""
    url = f"{base.rstrip('/')}/{key}?wait_for_change=true&timeout_sec=60"
    last = None
    while not stop.is_set():
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=70) as response:
                value = response.read().decode("utf-8", "replace").strip()
        except (OSError, urllib.error.URLError, ValueError) as e:
            logger.debug("metadata %s: %s", key, e)
            stop.wait(RETRY_SECONDS)
            continue
        if value in NOTICES[key]:
            notice(f"the metadata server says {key.rsplit('/', 1)[-1]} = {value}")
            return
        if value == last:
            stop.wait(RETRY_SECONDS)  # a server that answers at once, without waiting for a change
        last = value


@contextlib.contextmanager
def watching(notice: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, call `notice(why)` when this VM's metadata announces its end (on a
    Google Cloud VM, or wherever `$DRYDOCK_GCE_METADATA_URL` points); elsewhere nothing."""
    base = os.environ.get(URL_ENV) or (METADATA_URL if on_google_cloud() else None)
    if base is None:
        yield
        return
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_watch, args=(base, key, notice, stop), name=f"drydock-gce-{key}", daemon=True
        )
        for key in NOTICES
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()  # a thread in a long poll ends with it (daemon: it never holds the process)
