"""`steps.imports.import_ml`: JAX comes with its persistent compilation cache, under the Drydock
cache directory unless JAX_COMPILATION_CACHE_DIR says where; a second process loads what the first
compiled."""

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
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "value": float(out)}))
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
    entries = sorted(p.name for p in (tmp_path / "cache" / "jax").iterdir())
    assert entries, "nothing was cached"
    second = run(env)
    assert second == first  # the same result from the cached executable
    assert sorted(p.name for p in (tmp_path / "cache" / "jax").iterdir()) == entries  # nothing new compiled
    # An explicit JAX_COMPILATION_CACHE_DIR wins.
    assert run({**env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")})["dir"] == str(tmp_path / "mine")
