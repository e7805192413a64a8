"""JAX's persistent compilation cache: where it is, and what this process got from it.

Every Drydock process that imports JAX through `steps.imports.import_ml` keeps the programs it
compiles in one directory and loads them from there the next time: a retried attempt, a follower
evaluating the checkpoints, a rerun, the test suite's processes. The directory is
`$JAX_COMPILATION_CACHE_DIR`, else `$DRYDOCK_CACHE_DIR/jax`, else `~/.cache/drydock/jax`: on a
cluster, point `JAX_COMPILATION_CACHE_DIR` at a directory every host reaches (docs/cluster.md),
or each host keeps its own.

`CompilationStats` counts what the cache did from JAX's own monitoring events: the programs
asked for, those loaded from the cache, the seconds spent tracing, lowering and compiling, and the
compile time the hits saved (as recorded when each was compiled). A training says it at its first
step ("compilation: 14 programs, 12 loaded from the cache ...") and keeps the totals in its result.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.steplib import cache_dir

__all__ = [
    "CompilationStats",
    "compilation_cache_dir",
    "compilation_stats",
    "count_compilations",
    "use_compilation_cache",
]


def compilation_cache_dir() -> str:
    """Where JAX's persistent compilation cache is: `$JAX_COMPILATION_CACHE_DIR`, else `jax/` in
    Drydock's cache (`$DRYDOCK_CACHE_DIR`, else `$XDG_CACHE_HOME/drydock`, else `~/.cache/drydock`)."""
    explicit = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if explicit:
        return explicit
    return cache_dir("jax")


def use_compilation_cache() -> None:
    """Point JAX's persistent compilation cache at `compilation_cache_dir()` (environment
    variables, read when JAX is imported; a process that imported JAX already keeps its own).
    Every program is kept, however quick to compile: a training compiles a dozen small ones."""
    if "jax" in sys.modules:
        return
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", compilation_cache_dir())
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@dataclass
class CompilationStats:
    """What JAX compiled in this process, and what it loaded from the persistent cache."""

    programs: int = 0
    """Programs given to the backend (each compiled or loaded from the cache)."""
    from_cache: int = 0
    """Of those, loaded from the persistent cache."""
    trace_seconds: float = 0.0
    lower_seconds: float = 0.0
    backend_seconds: float = 0.0
    """XLA compiling, or reading a program from the cache."""
    saved_seconds: float = 0.0
    """The compile time of the programs loaded, as recorded when each was compiled, less the read."""

    @property
    def compiled(self) -> int:
        """Programs compiled here (not found in the cache)."""
        return self.programs - self.from_cache

    @property
    def seconds(self) -> float:
        """Tracing, lowering and compiling (or loading) together: the start-up compilation costs."""
        return self.trace_seconds + self.lower_seconds + self.backend_seconds

    def since(self, earlier: CompilationStats) -> CompilationStats:
        """What happened after `earlier` (a snapshot of the same process)."""
        return CompilationStats(**{k: v - getattr(earlier, k) for k, v in asdict(self).items()})

    def describe(self) -> str:
        """One line, e.g. `14 programs, 12 loaded from the compilation cache (saved ~15.2 s), 2
        compiled; 3.1 s tracing, lowering and compiling`."""
        if not self.programs:
            return "no program compiled"
        loaded = f"{self.from_cache} loaded from the compilation cache"
        if self.from_cache:
            loaded += f" (saved ~{self.saved_seconds:.1f} s)"
        return (
            f"{self.programs} programs, {loaded}, {self.compiled} compiled; "
            f"{self.seconds:.1f} s tracing, lowering and compiling"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()},
            "compiled": self.compiled,
            "cache": compilation_cache_dir(),
        }


_LOCK = threading.Lock()
_STATS = CompilationStats()
_WATCHING = False

# JAX's event names (jax/_src/dispatch.py, jax/_src/compiler.py).
_DURATIONS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_seconds",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_seconds",
    "/jax/core/compile/backend_compile_duration": "backend_seconds",
    "/jax/compilation_cache/compile_time_saved_sec": "saved_seconds",
}


def _on_event(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        with _LOCK:
            _STATS.from_cache += 1


def _on_duration(event: str, duration_secs: float, **_: Any) -> None:
    field = _DURATIONS.get(event)
    if field is None:
        return
    with _LOCK:
        setattr(_STATS, field, getattr(_STATS, field) + float(duration_secs))
        if field == "backend_seconds":
            _STATS.programs += 1


def compilation_stats() -> CompilationStats:
    """A snapshot of this process's counts so far (zero until JAX is imported by `import_ml`)."""
    count_compilations()
    with _LOCK:
        return CompilationStats(**asdict(_STATS))


def count_compilations() -> None:
    """Count from now on: listen to JAX's monitoring events (once per process)."""
    global _WATCHING
    with _LOCK:
        if _WATCHING:
            return
        from jax import monitoring

        monitoring.register_event_listener(_on_event)
        monitoring.register_event_duration_secs_listener(_on_duration)
        _WATCHING = True
