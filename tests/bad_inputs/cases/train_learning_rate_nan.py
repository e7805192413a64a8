"""A learning rate that is not a number."""

# expect: step 'train/tiny', field `optimizer.learning_rate`: must be a positive finite number, got nan
# args:
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import train

step = train(OptimizerSpec(learning_rate=float("nan")))

if __name__ == "__main__":
    executor_main([step])
