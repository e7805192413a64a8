"""Import the heavy libraries a step function needs, one thread at a time.

With the local backend several steps start at once in threads of one process. NumPy's extension
module fails when two threads initialise it together ("cannot import name '__cpu_features__' from
partially initialized module"), and JAX, Levanter and lm-eval import NumPy first. Each step
function that needs them calls `import_ml()` before anything else, so the first one imports them
and the others wait, then find them imported. Levanter's own modules import each other in
cycles (`levanter.callbacks` -> `levanter.data` -> `levanter.layers.attention` -> ...): a thread
entering a cycle at one end while another enters at the other gets a half-initialized module
("cannot import name 'AttentionMask' from partially initialized module"), so the model steps
import every Levanter module they use (`LEVANTER_MODELS`) under the lock too.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import warnings

from steps.compilation_cache import compilation_cache_dir, count_compilations, use_compilation_cache

__all__ = ["LEVANTER", "LEVANTER_MODELS", "compilation_cache_dir", "import_ml", "quiet_known_noise"]

_LOCK = threading.Lock()
LEVANTER = ("jax", "haliax", "equinox", "levanter")
"""What a step built on Levanter needs (NumPy comes first in any case)."""
LEVANTER_MODELS = (
    *LEVANTER,
    "levanter.checkpoint",
    "levanter.trainer",
    "levanter.eval",
    "levanter.main.train_lm",
    "levanter.models.mixtral",
    "levanter.models.qwen3_moe",
    "steps.models.drydock_moe",
    "steps.training.tracker",
    "steps.training.checkpointer",
    "steps.training.levanter_fixes",
    "steps.training.router_stats",
    "steps.training.rewinds",
)
"""What the steps that build, train or load a model use: training, evaluation, task scores, and
counting a drydock_moe model's parameters."""


def import_ml(*modules: str) -> None:
    """Import NumPy, then `modules` (e.g. `*LEVANTER`), under one lock, JAX with its compilation
    cache; silence known noise."""
    with _LOCK:
        use_compilation_cache()
        for name in ("numpy", *modules):
            importlib.import_module(name)
        if "jax" in sys.modules:
            count_compilations()
        quiet_known_noise()


class _DropMessages(logging.Filter):
    def __init__(self, *messages: str) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


_QUIETED = False


def quiet_known_noise() -> None:
    """Drop library messages that look alarming but say nothing wrong about a Drydock run:

    * Levanter's `Unknown leaf type <class 'NoneType'>`, logged for every absent optional parameter
      (a bias the model does not have) each time a checkpoint is loaded: there is nothing to load;
    * the warning of Levanter's Hugging Face export that it could not read the reference model's
      config: train_moe runs offline on purpose (`hub_offline`), and the export then derives the
      config from the model type, as docs/training.md says.
    """
    global _QUIETED
    if _QUIETED:
        return
    logging.getLogger("levanter.tensorstore_serialization").addFilter(
        _DropMessages("Unknown leaf type <class 'NoneType'>")
    )
    warnings.filterwarnings("ignore", message="Could not load reference HF config", category=UserWarning)
    _QUIETED = True
