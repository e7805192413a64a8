"""Keeps this runner's leases alive, and reports the ones it lost.

One thread for all leases of a run: every `interval` seconds it renews each held lease. A lease
that is no longer ours (another runner took it over after it expired) is reported through
`on_lost(label)` at once. If storage keeps failing, a lease counts as lost once its last
successful renewal is older than the lease timeout, since others may then take it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.lease import Owner
from pipeline.storage.step_store import StepStore

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)


@dataclass
class _Held:
    label: str
    token: int
    renewed_at: float


class Heartbeat:
    """Renews held leases on a timer thread."""

    def __init__(
        self,
        store: StepStore,
        owner: Owner,
        ttl: float,
        interval: float,
        on_lost: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._owner = owner
        self._ttl = ttl
        self._interval = interval
        self._on_lost = on_lost
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drydock-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def add(self, step_dir: str, label: str, token: int, since: float | None = None) -> None:
        """Keep the lease on `step_dir` alive; `since`: when it was taken (read before taking it,
        so that `valid_until` never runs past the expiry written in `.lease`); default now."""
        with self._lock:
            self._held[step_dir] = _Held(label, token, self._clock() if since is None else since)

    def remove(self, step_dir: str) -> None:
        with self._lock:
            self._held.pop(step_dir, None)

    def valid_until(self, step_dir: str) -> float:
        """Until when (this heartbeat's clock) our lease on `step_dir` is surely still ours;
        -inf once it is not held (lost, or the attempt ended)."""
        with self._lock:
            entry = self._held.get(step_dir)
            return float("-inf") if entry is None else entry.renewed_at + self._ttl

    def held(self) -> dict[str, tuple[str, int]]:
        """Step directory -> (label, token) of every lease held now."""
        with self._lock:
            return {d: (h.label, h.token) for d, h in self._held.items()}

    def beat(self) -> None:
        """Renew every held lease once (the timer thread calls this; tests may too)."""
        with self._lock:
            held = list(self._held.items())
        for step_dir, entry in held:
            # Read before renewing: the renewed lease expires at (no earlier than) before + ttl,
            # so `valid_until` never promises more than `.lease` says.
            before = self._clock()
            try:
                ok = self._store.renew(step_dir, self._owner, entry.token, self._ttl)
            except Exception as e:  # storage hiccup: retry next beat unless the lease has run out
                logger.warning("could not renew the lease of %s: %s", entry.label, e)
                ok = self._clock() - entry.renewed_at < self._ttl
            else:
                entry.renewed_at = before if ok else entry.renewed_at
            if not ok:
                with self._lock:
                    self._held.pop(step_dir, None)
                self._on_lost(entry.label)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()
