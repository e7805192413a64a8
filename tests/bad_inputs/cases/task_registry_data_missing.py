"""A registry task whose data directory lacks it."""

# expect: step 'tasks/x', field `tasks[0] (piqa)`: its data is missing: no directory
# args:
import os

from pipeline import executor_main
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import declared_training

tasks = task_eval_step("tasks/x", train=declared_training(), tasks=["piqa"], task_data=os.getcwd())

if __name__ == "__main__":
    executor_main([tasks])
