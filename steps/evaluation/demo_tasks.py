"""The demo's offline task suite (built by `scripts/make_tasks.py` from the demo corpus).

    sums      "57 * 10 =" -> the right result among 3 near misses     chance 1/4, 300 examples
    stories   a passage -> its true next sentence among 3 from others  chance 1/4, 300 examples

Paths are relative to the repository root: pass it as the task_eval step's `data_root`.
"""

from __future__ import annotations

from steps.evaluation.eval_tasks import EvalTask, inline_task

__all__ = ["DEMO_TASKS", "demo_task"]


def demo_task(name: str, num_fewshot: int = 0) -> EvalTask:
    """One of the demo tasks (`sums`, `stories`), with `num_fewshot` examples from its fewshot split."""
    return inline_task(
        name,
        {"test": f"data/tasks/{name}/test.jsonl", "fewshot": f"data/tasks/{name}/fewshot.jsonl"},
        doc_to_text="{{query}}",
        doc_to_choice="{{choices}}",
        doc_to_target="{{gold}}",
        num_fewshot=num_fewshot,
        fewshot_split="fewshot",
        fewshot_delimiter="\n",
    )


DEMO_TASKS = (demo_task("sums"), demo_task("stories"))
