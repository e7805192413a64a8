"""An inline multiple-choice task without its choices template."""

# expect: step 'tasks/x', field `tasks[0] (sums).doc_to_choice`: an inline multiple_choice task
# args:
from pipeline import executor_main
from steps.evaluation.eval_tasks import inline_task
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import declared_training

sums = inline_task(
    "sums", {"test": "data/tasks/sums/test.jsonl"}, doc_to_text="{{query}}", doc_to_target="{{gold}}"
)
tasks = task_eval_step("tasks/x", train=declared_training(), tasks=[sums], data_root="/work/none")

if __name__ == "__main__":
    executor_main([tasks])
