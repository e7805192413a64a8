"""A learning rate of zero: nothing would be learned, after hours of tokenizing."""

# expect: step 'train/tiny', field `optimizer.learning_rate`: must be a positive finite number, got 0.0
# args:
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import train

step = train(OptimizerSpec(learning_rate=0.0))

if __name__ == "__main__":
    executor_main([step])
