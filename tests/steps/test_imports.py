"""`steps.imports.import_ml`: JAX comes with its persistent compilation cache, under the Drydock
cache directory unless JAX_COMPILATION_CACHE_DIR says where; a second process loads what the first
compiled, and says so (`steps.compilation_cache.compilation_stats`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMPILE = """
import json, time
from steps.imports import import_ml
import_ml("jax")
import jax, jax.numpy as jnp
began = time.perf_counter()
out = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((64, 64))).block_until_ready()
from steps.compilation_cache import compilation_stats
stats = compilation_stats()
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "value": float(out),
                  "programs": stats.programs, "from_cache": stats.from_cache, "line": stats.describe()}))
"""


def run(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_steps_compile_into_the_drydock_cache_and_reuse_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PYTHONPATH=str(ROOT), DRYDOCK_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
    first = run(env)
    assert first["dir"] == str(tmp_path / "cache" / "jax")
    assert first["programs"] >= 1 and first["from_cache"] == 0, first
    entries = sorted(p.name for p in (tmp_path / "cache" / "jax").iterdir())
    assert entries, "nothing was cached"
    second = run(env)
    assert second["value"] == first["value"]  # the same result from the cached executable
    # Every program the first process compiled, the second loaded, and says so.
    assert second["programs"] == first["programs"] and second["from_cache"] == first["programs"], second
    assert f"{first['programs']} loaded from the compilation cache" in second["line"]
    assert sorted(p.name for p in (tmp_path / "cache" / "jax").iterdir()) == entries  # nothing new compiled
    # An explicit JAX_COMPILATION_CACHE_DIR wins.
    assert run({**env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")})["dir"] == str(tmp_path / "mine")
