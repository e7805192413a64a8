"""An inline task whose file has an answer index outside its row's choices (lm-eval would score it
as always wrong)."""

# expect: bad_inputs/data/answer_outside.jsonl line 2: the answer index 4 is outside its 4 choices
# args:
import os

from pipeline import executor_main
from steps.evaluation.eval_tasks import inline_task
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import declared_training

sums = inline_task(
    "sums",
    {"test": "data/answer_outside.jsonl"},
    doc_to_text="{{query}}",
    doc_to_choice="{{choices}}",
    doc_to_target="{{gold}}",
)
tasks = task_eval_step(
    "tasks/x",
    train=declared_training(),
    tasks=[sums],
    data_root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
)

if __name__ == "__main__":
    executor_main([tasks])
