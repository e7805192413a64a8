"""The tiny MoE the tests train and declare: the demo corpus tokenized and mixed, `TINY_MOE`
trained for tens of steps on 8 x 64-token batches. One declaration for every test: test modules
import it, and so do the experiment files tests write (`from tests.steps.tiny import mix, train`,
with `PYTHONPATH` at the repository). The defaults are the bad-input cases' (`train/tiny`, 100
steps); a test passes what it needs. `trained_tiny` (tests/steps/conftest.py) trains one once per
session for the tests that only read a trained model.

Tests that train their own say why: they kill it (test_train, test_checkpoint_tiers,
test_task_eval's followers), train another family, optimizer or retention (test_train), write to
S3 (test_remote_outputs), corrupt its data (test_spike_recovery), branch it (test_branch), watch
it against a prediction (test_prediction), or run it as a gang of hosts (test_multihost).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline import Step, this_output
from steps.data.mixture import mixture_step
from steps.data.tokenize import tokenize_step
from steps.models import TINY_MOE
from steps.training.train_moe import OptimizerSpec, train_moe_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QWEN = dataclasses.asdict(TINY_MOE)
"""The tiny model's fields, as tests write them into experiment files (`MoeModelConfig(**QWEN)`)."""
DRYDOCK = {
    **QWEN,
    "family": "drydock_moe",
    "num_shared_experts": 1,
    "sliding_window": 16,  # of 64 tokens
    "global_every": 2,
    "num_global_kv_heads": 1,
    "balancing": "bias",
}
"""The tiny model in Drydock's own family: a shared expert, a windowed local layer with 2 KV heads
and a global one with 1, the balancing bias."""


def tok(domain: str, name: str | None = None, **overrides: Any) -> Step:
    """The demo corpus's `domain` (prose or arithmetic), tokenized with the committed tokenizer."""
    args: dict[str, Any] = dict(
        train=[f"data/corpus/{domain}/train-*.jsonl"],
        validation=[f"data/corpus/{domain}/validation-*.jsonl"],
        tokenizer="data/tokenizer",
        input_root=ROOT,
    )
    return tokenize_step(name or f"tokenized/{domain}", **{**args, **overrides})


def mix(name: str = "mixture/tiny", steps: int = 100, **overrides: Any) -> Step:
    """Prose and arithmetic half and half, enough tokens for `steps` steps of 8 x 64 tokens."""
    args: dict[str, Any] = dict(
        components={"prose": tok("prose"), "arithmetic": tok("arithmetic")},
        weights={"prose": 0.5, "arithmetic": 0.5},
        target_tokens=steps * 8 * 64,
        batch_size=8,
        seq_len=64,
        validation=["prose"],
    )
    return mixture_step(name, **{**args, **overrides})


def train(optimizer: OptimizerSpec | None = None, name: str = "train/tiny", **overrides: Any) -> Step:
    """`TINY_MOE` trained on `mix()` (or `data=`) for 100 steps (or `num_steps=`)."""
    args: dict[str, Any] = dict(model=TINY_MOE, batch_size=8, seq_len=64, num_steps=100)
    if "data" not in overrides:
        args["data"] = mix()
    return train_moe_step(name, optimizer=optimizer or OptimizerSpec(), **{**args, **overrides})


def declared_training(num_steps: int = 40, **options: Any) -> Step:
    """A training to declare steps against, never run: its data is a placeholder step."""
    from tests.pipeline.stepfns import WriteConfig, write_value

    data = Step("mixture/x", write_value, WriteConfig(this_output()))
    return train_moe_step(
        "train/x",
        data=data,
        model=TINY_MOE,
        batch_size=8,
        seq_len=64,
        num_steps=num_steps,
        checkpoint_interval=10,
        **options,
    )


# -- training and evaluating it, as a test runs an experiment ------------------------------------------

EXPERIMENT = """
from pipeline import executor_main
from steps.evaluation.evaluate import evaluate_step
from steps.models import MoeModelConfig
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import mix, train

data = mix("mixture/test", steps={steps}, validation=["prose", "arithmetic"])
training = train(OptimizerSpec(**{optimizer!r}), "train/test", data=data, model=MoeModelConfig(**{model!r}),
                 num_steps={steps}, checkpoint_interval=10, eval_interval=1000, router_stats_interval=5)
evaluation = evaluate_step("evaluate/test", train=training, data=data, seq_len=64, batch_size=8,
                           max_batches=4)
if __name__ == "__main__":
    executor_main([evaluation])
"""
"""An experiment file (format it with `model`, `optimizer` and `steps`): the demo data mixed,
a training of `MoeModelConfig(**model)` and its evaluation on both validation sets."""


def experiment(tmp_path: Path, model: dict, optimizer: dict, steps: int) -> Path:
    """`EXPERIMENT` written as `tmp_path/exp.py`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "exp.py"
    path.write_text(EXPERIMENT.format(root=str(ROOT), model=model, optimizer=optimizer, steps=steps))
    return path


DEMO_TOKENS = """
from pipeline import executor_main
from tests.steps.tiny import tok
if __name__ == "__main__":
    executor_main([tok("prose"), tok("arithmetic")])
"""

_demo_tokens: Path | None = None


def demo_tokens() -> Path:
    """A prefix holding the demo corpus tokenized (`tok("prose")`, `tok("arithmetic")`), made once
    per test session by `drydock run`, as a test's run would make it. Tokenizing it took 7 to 17 s
    of every training test's run; a test's new local prefix starts from a copy instead (`seed`):
    identities do not depend on the prefix, so the copies are CACHED steps of the same identity."""
    global _demo_tokens
    if _demo_tokens is None:
        where = Path(tempfile.mkdtemp(prefix="drydock-demo-tokens-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        exp = where / "demo_tokens.py"
        exp.write_text(DEMO_TOKENS)
        result = subprocess.run(
            command(exp, where / "prefix", seeded=False),
            env=env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        _demo_tokens = where / "prefix"
    return _demo_tokens


def seed(prefix: Path | str) -> None:
    """Start a new `prefix` (a path, or a URL on an object store this process's environment
    reaches) with the session's demo tokens (`demo_tokens`); a prefix that exists already (a
    rerun) is left as it is."""
    tokens = demo_tokens() / "tokenized"
    if "://" in str(prefix):
        import fsspec

        fs, path = fsspec.core.url_to_fs(str(prefix))
        if not fs.exists(path):
            fs.put(str(tokens), f"{path}/tokenized", recursive=True)
    elif not os.path.exists(prefix):
        shutil.copytree(tokens, Path(prefix) / "tokenized")


def command(exp: Path, prefix: Path | str, *extra: str, seeded: bool = True) -> list[str]:
    """`drydock run` of `exp` on `prefix` (a path or URL) with the local backend, then `extra`.
    A new local prefix is `seed`ed first (`seeded=False`: a test that must see the tokenizing)."""
    if seeded:
        seed(prefix)
    return [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        str(exp),
        "--prefix",
        str(prefix),
        "--backend",
        "local",
        *extra,
    ]


def env() -> dict[str, str]:
    """This environment, with the repository importable (the experiment imports `tests.steps.tiny`)."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def train_and_evaluate(exp: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    """Run `exp` on `prefix` to the end; it must succeed."""
    result = subprocess.run(
        command(exp, prefix), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def step_dir(prefix: Path, name: str) -> Path:
    """The one directory of step `name` under `prefix`."""
    (found,) = prefix.glob(f"{name}-*")
    return found


def ledger_of(prefix: Path, name: str) -> dict[str, Any]:
    """Step `name`'s ledger as `drydock status MANIFEST --json --ledger` gives it (the newest run's
    manifest under `prefix`); each attempt's split is checked to sum to its held time (1%)."""
    import json

    manifest = max((prefix / "experiments").glob("*.json"), key=lambda p: p.stat().st_mtime)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "status", str(manifest), "--json", "--ledger"],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (step,) = [s for s in json.loads(result.stdout)["steps"] if s["name"] == name]
    ledger = step["ledger"]
    for attempt in ledger["attempts"]:
        split = sum(attempt["seconds"].values())
        assert abs(split - attempt["held_seconds"]) <= 0.01 * attempt["held_seconds"] + 1e-3, attempt
    return ledger
