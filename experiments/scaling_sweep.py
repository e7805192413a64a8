"""A scaling sweep with a predicted loss: fit scaling laws to a grid of tiny MoEs, check them on a larger one.

    tokenized/prose, tokenized/arithmetic   the committed demo corpus (shared with tiny_moe.py)
    mixture/scaling                         one even mix, sized for MIXTURE_STEPS steps
    train/scaling/d{H}-s{S}                 a tiny Qwen3-MoE of hidden size H trained for S steps,
                                            for every H in SIZES and S in BUDGETS, and the TARGET;
                                            per size, the longest budget is trained and the
                                            shorter ones are its cooldown branches
    evaluate/scaling/d{H}-s{S}              loss per validation set of each
    scaling/fit                             Chinchilla's law, Kaplan's law (N x D interaction) and
                                            the IsoFLOP method fitted to the grid, each checked on
                                            the grid's 3 largest points held out; the best of that
                                            check predicts the target with an interval, then is
                                            compared with its measured loss (fit.json, fit.png)

This is how a team checks a predicted loss before committing months of compute: fit small runs,
predict the big one, and (here, where the big one is cheap) measure it. The target has 2.25 times
the compute of the grid's largest run (2.24 times its N, at the grid's longest D). `drydock plan`
shows the grid at once; a rerun reuses every finished point, and a grid made larger trains only
the new points. All models share everything but their width: 2 layers, 4 experts with top-2 routing,
expert width 2 x hidden, 4 query and 2 KV heads, AdamW at 3e-3 under warmup-stable-decay: 20
warm-up steps, the peak held, a cooldown over the last fifth of each run's own budget (so every
D is a complete run, as Chinchilla's fits assume). A run of S steps and the longest run are the
same run until S's cooldown begins, so S is a branch of the longest run from its checkpoint
there (`train_moe_step(init_from=...)`): it costs only its cooldown.

One mixture serves every budget: its weights do not change with the step, and Levanter's stream
depends on the data seed, not on the run's length, so a run of S steps reads the first S batches
of a longer run's stream, and budgets differ only in length.
(A phase schedule, like tiny_moe's, is given in steps and would give each budget a different mix.)

On the local backend, trainings run one at a time unless `--max_concurrent` says otherwise: they
share the process, and Levanter's tracker is global to it (on Ray each gets its own process).
About 12 minutes on a 2-core CPU (docs/scaling.md has the figures and why the grid is laid out so).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pipeline import Resources, Step, StepDeclarationError, executor_main
from pipeline.run.options import parse_options
from steps.data.mixture import mixture_step
from steps.data.tokenize import tokenize_step
from steps.evaluation.evaluate import evaluate_step
from steps.models import MoeModelConfig, tiny_moe
from steps.scaling.fit import scaling_fit_step, scaling_point
from steps.training.train_moe import OptimizerSpec, train_moe_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = "data/tokenizer"
BATCH_SIZE = 8
SEQ_LEN = 128
SIZES = (24, 32, 40, 48, 64)
"""Hidden sizes of the grid's models: five, so that three sizes share each of several compute budgets
(the IsoFLOP method's profiles)."""
BUDGETS = (250, 500, 1000)
"""Training steps of the grid's runs (x BATCH_SIZE x SEQ_LEN tokens). None shorter than 250: at 150
steps a run's loss still says more about how fast a model starts than about its size."""
TARGET = (96, 1000)
"""The larger config whose loss is predicted, then measured: (hidden size, steps)."""
MIXTURE_STEPS = 1000
"""Steps the one mixture is sized for, and so the longest run: at 8 x 128 tokens a step, 1,000 steps
read the prose component 2.8 times (max_epochs=3). Fixed rather than taken from the grid, so that
adding points keeps the mixture's identity, and with it every finished training."""
WARMUP_STEPS = 20
"""Warm-up, in steps: the same for every run, so every budget's schedule is the same up to its cooldown."""
COOLDOWN = 0.2
"""The last fifth of every run decays the rate (warmup-stable-decay)."""


def sweep_optimizer(warmup_steps: int = WARMUP_STEPS, cooldown: float = COOLDOWN) -> OptimizerSpec:
    """AdamW at 3e-3, warmed up over `warmup_steps`, held, and decayed over the last `cooldown`."""
    return OptimizerSpec(name="adamw", learning_rate=3e-3, warmup=warmup_steps, decay=cooldown)


def branch_point(steps: int, cooldown: float) -> int:
    """Where a run of `steps` starts its cooldown (Levanter decays over int(cooldown x steps))."""
    return steps - int(cooldown * steps)


def tiny_model(hidden_dim: int) -> MoeModelConfig:
    """The grid's Qwen3-MoE at width `hidden_dim` (everything else fixed)."""
    return tiny_moe(hidden_dim)


def build(
    sizes: Sequence[int] = SIZES,
    budgets: Sequence[int] = BUDGETS,
    target: tuple[int, int] = TARGET,
    *,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    mixture_steps: int = MIXTURE_STEPS,
    warmup_steps: int = WARMUP_STEPS,
    cooldown: float = COOLDOWN,
    max_epochs: float = 3,
    data: Step | None = None,
) -> list[Step]:
    """The sweep's final step (the fit); every training and evaluation hangs off it.

    `data`: a mixture step of your own corpus (`mixture_step`, sized for at least the longest
    budget), whose validation sets the evaluations read; None: the demo corpus (`sweep_mixture`).

    Per size, one run of the longest budget is trained (its own cooldown at its end), and every
    shorter budget is a cooldown branch of it: it starts from the long run's checkpoint where its
    own cooldown begins, which the long run reaches with the same weights, optimizer state and
    data as a run of that budget from scratch would (same warm-up, then the same constant rate),
    so it is that run, for the price of its cooldown. Raises `StepDeclarationError` naming the
    training step if a run is longer than the mixture.
    """
    mixture = data or sweep_mixture(
        batch_size=batch_size, seq_len=seq_len, mixture_steps=mixture_steps, max_epochs=max_epochs
    )
    spec = sweep_optimizer(warmup_steps, cooldown)
    longest = max(budgets)
    shorter = sorted(b for b in budgets if b != longest)
    starts = [branch_point(b, cooldown) for b in shorter]
    interval = math.gcd(*starts) if starts else longest

    def run(hidden_dim: int, steps: int, **branch: Any) -> tuple[Step, Step]:
        return sweep_run(
            mixture, hidden_dim, steps, batch_size=batch_size, seq_len=seq_len, optimizer=spec, **branch
        )

    points = []
    for h in sizes:
        stable = run(h, longest, checkpoint_interval=interval)
        runs = {longest: stable}
        for budget in shorter:
            runs[budget] = run(h, budget, init_from=stable[0], init_step=branch_point(budget, cooldown))
        points.extend(scaling_point(*runs[budget]) for budget in sorted(runs))
    fit = scaling_fit_step("scaling/fit", points=points, target=scaling_point(*run(*target)))
    return [fit]


def sweep_mixture(
    *,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    mixture_steps: int = MIXTURE_STEPS,
    max_epochs: float = 3,
) -> Step:
    """The one even mixture of the demo corpus that every run of the sweep reads (no component
    read more than `max_epochs` times)."""
    corpus = {
        domain: tokenize_step(
            f"tokenized/{domain}",
            train=[f"data/corpus/{domain}/train-*.jsonl"],
            validation=[f"data/corpus/{domain}/validation-*.jsonl"],
            tokenizer=TOKENIZER,
            input_root=ROOT,
        )
        for domain in ("prose", "arithmetic")
    }
    return mixture_step(
        "mixture/scaling",
        components=corpus,
        weights={"prose": 0.5, "arithmetic": 0.5},
        target_tokens=mixture_steps * batch_size * seq_len,
        batch_size=batch_size,
        seq_len=seq_len,
        validation=["prose", "arithmetic"],
        max_epochs=max_epochs,
    )


def sweep_run(
    mixture: Step,
    hidden_dim: int,
    steps: int,
    *,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    optimizer: OptimizerSpec | None = None,
    checkpoint_interval: int | None = None,
    init_from: Step | None = None,
    init_step: int | None = None,
) -> tuple[Step, Step]:
    """One point of the sweep: the training of width `hidden_dim` for `steps` steps and its
    evaluation. Seed 0 is the sweep's; another seed (model init and data order) is another step,
    `d{H}-s{S}-seed{K}` (benchmarks/scaling_noise.py measures the spread). `init_from` and
    `init_step` make it a cooldown branch of a longer run; `checkpoint_interval` keeps the
    checkpoints branches start from (else only the final one)."""
    label = f"d{hidden_dim}-s{steps}" + (f"-seed{seed}" if seed else "")
    branch = {} if init_from is None else {"init_from": init_from, "init_step": init_step}
    # A budget longer than the mixture is refused by train_moe_step, naming this step.
    train = train_moe_step(
        f"train/scaling/{label}",
        data=mixture,
        model=tiny_model(hidden_dim),
        optimizer=optimizer or sweep_optimizer(),
        batch_size=batch_size,
        seq_len=seq_len,
        num_steps=steps,
        seed=seed,
        checkpoint_interval=checkpoint_interval or steps,  # evaluate reads only the final one
        eval_interval=10**9,  # evaluate/scaling/* scores the final model on every validation set
        router_stats_interval=0,
        hf_export=False,
        resources=Resources(cpus=1),
        **branch,
    )
    evaluation = evaluate_step(
        f"evaluate/scaling/{label}", train=train, data=mixture, seq_len=seq_len, batch_size=batch_size
    )
    return train, evaluation


def _one_training_at_a_time(argv: list[str]) -> list[str]:
    """`--max_concurrent 1` on the local backend unless the command line sets it (see above)."""
    try:
        options = parse_options(argv)
    except Exception:  # executor_main reports a bad command line itself
        return argv
    if options.backend == "local" and options.max_concurrent is None:
        return [*argv, "--max_concurrent", "1"]
    return argv


def main(build_sweep: Callable[[], list[Step]], description: str) -> None:
    """Run a sweep from the command line: a grid that cannot be declared is one sentence and exit
    2; on the local backend, one training at a time unless the command line says otherwise."""
    try:
        sweep = build_sweep()
    except StepDeclarationError as e:  # an edited grid that cannot run: one sentence, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    executor_main(sweep, description=description, argv=_one_training_at_a_time(sys.argv[1:]))


if __name__ == "__main__":
    main(build, "scaling sweep: fit L(N, D) on tiny MoEs, predict and measure a larger one")
