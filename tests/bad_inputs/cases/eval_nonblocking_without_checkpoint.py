"""An evaluation beside a running training that does not say which checkpoint it evaluates."""

# expect: step 'evaluate/x', field `blocking`: blocking=False evaluates a training that is still going
# args:
from pipeline import executor_main
from steps.evaluation.evaluate import evaluate_step
from tests.steps.tiny import declared_training

train = declared_training()
evaluation = evaluate_step("evaluate/x", train=train, data=train, seq_len=64, blocking=False)

if __name__ == "__main__":
    executor_main([evaluation])
