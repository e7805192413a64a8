"""Declaring steps loads none of the engine: no storage, executor, fsspec, rich or draccus."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("fsspec", "rich", "draccus", "ray", "jax", "levanter")


def loaded_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(out.stdout.split())


def engine_modules(modules: set[str]) -> set[str]:
    layers = ("pipeline.storage", "pipeline.run", "pipeline.cli", "pipeline.observe")
    return {m for m in modules if m.startswith(layers)}


def test_import_pipeline_step_loads_no_engine_and_no_heavy_library():
    modules = loaded_after("import pipeline.step")
    assert not engine_modules(modules)
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


def test_declaring_a_dag_with_the_public_api_loads_no_storage_or_executor():
    modules = loaded_after(
        """
        from pipeline import Step, Resources, output_of, this_output, versioned
        from tests.pipeline.stepfns import WriteConfig, write_value
        a = Step("raw/a", write_value, WriteConfig(value=versioned("a"), output=this_output()))
        b = Step("raw/b", write_value, WriteConfig(value=output_of(a), output=this_output()),
                 resources=Resources(cpus=2))
        """
    )
    assert not engine_modules(modules)
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


def test_the_public_names_resolve_to_their_modules():
    import pipeline
    from pipeline.cli.run import executor_main
    from pipeline.run.options import ExecutorMainConfig
    from pipeline.step import Step

    assert pipeline.executor_main is executor_main
    assert pipeline.ExecutorMainConfig is ExecutorMainConfig and pipeline.Step is Step
    assert set(pipeline.__all__) <= set(dir(pipeline))
