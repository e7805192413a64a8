"""Compile the bytecode of the modules a Drydock run imports, once, right after installing.

    python scripts/compile_bytecode.py          # what `make` runs after installing the lock
    python scripts/compile_bytecode.py --all    # every module in the environment (`make test`)

Compiling every module of the lock at install (`uv pip install --compile-bytecode`: some 25,000
files) took 36 s of a fresh clone's `make run` on a 2-core machine, most of it for modules no run
imports (Transformers' two thousand model files, Ray's libraries, SymPy, moto). Compiling none is
worse where `PYTHONDONTWRITEBYTECODE` is set, as on the project's machines: every process then
compiles every module it imports, every time it starts. So this imports what a run needs -- the
engine, every step module, the libraries the steps import when they run -- with bytecode writing
on, which compiles each of those modules once (about 4,500), and meanwhile compiles whole, in a
second process, the parts of Ray and numba that are loaded by their own processes or on first use.
A module this misses is compiled each time a process imports it, which costs time, not
correctness. `--all` compiles everything, as the test suite imports far more.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LIBRARIES = (
    "lm_eval.evaluator",
    "lm_eval.tasks",
    "levanter.eval_harness",
    "levanter.store",
    "levanter.models",
    "tokenizers",
    "transformers.tokenization_utils_fast",
    "scipy.optimize",
    "matplotlib.pyplot",
    "matplotlib.backends.backend_agg",
    "ray._private.workers.default_worker",
    "ray.dashboard.agent",
    "ray._private.log_monitor",
    "ray.job_submission",
    "aiohttp.web",
    "pydantic.v1",
    "scipy.io",
    "scipy.sparse.csgraph",
    "transformers.models.auto.modeling_auto",
    "jaxlib.mlir.dialects.mhlo",
    "PIL.BmpImagePlugin",
    "PIL.GifImagePlugin",
    "PIL.JpegImagePlugin",
    "PIL.PpmImagePlugin",
    "cffi",
    "pycparser.c_parser",
    "threadpoolctl",
)
"""What steps and Ray's processes import when they run, beyond the modules of `pipeline` and
`steps` themselves (the training libraries come from `steps.imports.LEVANTER_MODELS`)."""

TREES = (
    "ray/_private",
    "ray/_common",
    "ray/core",
    "ray/dashboard",
    "ray/autoscaler",
    "ray/util",
    "ray/thirdparty_files",
    "numba",
    "llvmlite",
)
"""Compiled whole: Ray's daemons (the dashboard agent, the runtime-env agent with its own copy of
aiohttp) load their modules by path, and numba imports its submodules as it compiles a kernel."""


def _own_modules() -> list[str]:
    names = []
    for package in ("pipeline", "steps"):
        module = importlib.import_module(package)
        names.append(package)
        found = pkgutil.walk_packages(module.__path__, prefix=f"{package}.")
        # A `__main__` runs its program when imported.
        names.extend(info.name for info in found if not info.name.endswith(".__main__"))
    return names


def _import_all() -> int:
    """Import what a run imports; returns how many modules that loaded."""
    from steps.imports import LEVANTER_MODELS, import_ml

    import_ml(*LEVANTER_MODELS, *LIBRARIES)
    for name in _own_modules():
        importlib.import_module(name)
    models = importlib.import_module("levanter.models")
    for info in pkgutil.iter_modules(models.__path__, prefix="levanter.models."):
        # Levanter's model registry imports each model's module when a config names its type.
        # An optional model whose extra dependency is not installed does not import.
        with contextlib.suppress(ImportError):
            importlib.import_module(info.name)
    return len(sys.modules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="compile every module in the environment")
    args = parser.parse_args(argv)
    site = sysconfig.get_paths()["purelib"]
    start = time.monotonic()
    if args.all:
        # quiet=2: a library may ship a file this Python cannot compile (substrait's uses 3.12
        # f-string syntax); it is never imported, and pip and uv skip it the same way.
        compileall.compile_dir(site, quiet=2, workers=0)
        compileall.compile_dir(ROOT, quiet=2, workers=0, rx=re.compile(_SKIP))
        took = time.monotonic() - start
        print(f"compiled the bytecode of every module in {site} and {ROOT} ({took:.0f} s)")
        return 0
    trees = [os.path.join(site, tree) for tree in TREES if os.path.isdir(os.path.join(site, tree))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # The trees in a second process while this one imports: two cores, two jobs.
    background = subprocess.Popen(
        [sys.executable, "-m", "compileall", "-q", "-j", "1", *trees], env=env, stdout=subprocess.DEVNULL
    )
    sys.dont_write_bytecode = False
    sys.path.insert(0, ROOT)
    loaded = _import_all()
    background.wait()
    print(
        f"compiled the bytecode of the {loaded:,} modules a run imports and of {len(trees)} library "
        f"trees ({time.monotonic() - start:.0f} s)"
    )
    return 0


# The work tree's own build and cache folders are not modules to compile.
_SKIP = r"[/\\](\.venv|\.git|drydock-runs|build|dist)[/\\]"

if __name__ == "__main__":
    sys.exit(main())
