"""Import the heavy libraries a step function needs, one thread at a time.

With the local backend several steps start at once in threads of one process. NumPy's extension
module fails when two threads initialise it together ("cannot import name '__cpu_features__' from
partially initialized module"), and JAX, Levanter and lm-eval import NumPy first. Each step
function that needs them calls `import_ml()` before anything else, so the first one imports them
and the others wait, then find them imported.
"""

from __future__ import annotations

import importlib
import threading

__all__ = ["import_ml"]

_LOCK = threading.Lock()
LEVANTER = ("jax", "haliax", "equinox", "levanter")
"""What a step built on Levanter needs (NumPy comes first in any case)."""


def import_ml(*modules: str) -> None:
    """Import NumPy, then `modules` (e.g. `*LEVANTER`), under one lock."""
    with _LOCK:
        for name in ("numpy", *modules):
            importlib.import_module(name)
