"""A warm-up of more steps than the run has."""

# expect: step 'train/tiny', field `optimizer.warmup`: 200 warm-up steps is not shorter than the run
# args:
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import train

step = train(OptimizerSpec(warmup=200))

if __name__ == "__main__":
    executor_main([step])
