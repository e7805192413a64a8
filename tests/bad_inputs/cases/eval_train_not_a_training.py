"""A task evaluation of something that is not a training step."""

# expect: step 'tasks/x', field `train`: give a train_moe step
# args:
from pipeline import Step, executor_main, this_output
from steps.evaluation.task_eval import task_eval_step
from tests.pipeline.stepfns import WriteConfig, write_value

data = Step("data/x", write_value, WriteConfig(this_output()))
tasks = task_eval_step("tasks/x", train=data, tasks=["piqa"])

if __name__ == "__main__":
    executor_main([tasks])
