"""A checkpoint the training never keeps (it saves every 10 steps and the last)."""

# expect: step 'tasks/x', field `checkpoint_step`: the training keeps checkpoints every 10 steps
# args:
from pipeline import executor_main
from steps.evaluation.task_eval import task_eval_step
from tests.steps.tiny import declared_training

tasks = task_eval_step("tasks/x", train=declared_training(), tasks=["piqa"], checkpoint_step=25)

if __name__ == "__main__":
    executor_main([tasks])
