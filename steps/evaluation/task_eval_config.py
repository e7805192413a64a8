"""The task_eval step's config, below the modules that read it (`task_eval`, `harness`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from steps.evaluation.eval_tasks import EvalTask
from steps.evaluation.follow import FollowSettings

__all__ = ["TaskEvalConfig"]


@dataclass(frozen=True)
class TaskEvalConfig:
    """Configuration of the task_eval step."""

    train: str
    """A train_moe step's output directory."""
    data: str
    """The mixture step the training read (its tokenizer tokenizes the tasks)."""
    output: str
    """The step's output directory (`this_output()`)."""
    tasks: tuple[EvalTask, ...] = ()
    checkpoint_step: int | None = None
    """Evaluate `checkpoints/step-N`; None: the final checkpoint (or each one, with `follow`)."""
    follow: bool = False
    """Evaluate every kept checkpoint as the training writes it (`steps.evaluation.follow`)."""
    final_step: int | None = None
    """The training's last step (its num_steps - 1): where a follower stops."""
    checkpoint_interval: int | None = None
    """The training's checkpoint_interval: which checkpoints it keeps."""
    max_examples: int | None = None
    """At most this many examples per task (lm-eval's `limit`); None: all of them."""
    max_length: int = 128
    """Tokens per packed sequence (at most the model's length); longer requests lose their start."""
    batch_size: int = 8
    log_samples: bool = False
    """Also write samples.jsonl: each example's per-choice log-likelihoods."""
    task_data: str | None = None
    """Registry tasks' rows: `<task_data>/<task>/<split>.jsonl`. None: the datasets cache."""
    datasets_cache: str | None = None
    """A `datasets` cache directory holding registry tasks' datasets (HF_DATASETS_CACHE)."""
    data_root: str | None = None
    """Where inline tasks' relative paths are (not versioned: the same files anywhere)."""
    bootstrap_iters: int = 1000
    """lm-eval's bootstrap iterations for the stderr of metrics without a closed form (acc's is)."""
    follow_settings: FollowSettings = field(default_factory=FollowSettings)
