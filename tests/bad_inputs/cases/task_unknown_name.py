"""A task name lm-eval does not know (a typo): the error suggests the close one."""

# expect: step 'tasks/x', field `tasks[1] (hellaswog)`: lm-eval has no task 'hellaswog'; did you mean
# args:
from pipeline import executor_main
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import declared_training

tasks = task_eval_step("tasks/x", train=declared_training(), tasks=["piqa", "hellaswog:10"])

if __name__ == "__main__":
    executor_main([tasks])
