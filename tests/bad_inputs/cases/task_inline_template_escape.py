"""An inline task whose template reaches for Python's internals."""

# expect: step 'tasks/x', field `tasks[0] (sums).doc_to_text`: the attribute '__class__' is not allowed
# args:
import dataclasses

from pipeline import executor_main
from steps.evaluation.demo_tasks import demo_task
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import ROOT, train

task = dataclasses.replace(demo_task("sums"), doc_to_text="{{ query.__class__ }}")
step = task_eval_step("tasks/x", train=train(), tasks=[task], data_root=ROOT)

if __name__ == "__main__":
    executor_main([step])
