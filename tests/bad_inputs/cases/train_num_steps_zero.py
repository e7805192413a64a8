"""A training of zero steps."""

# expect: step 'train/tiny', field `num_steps`: must be a positive whole number, got 0
# args:
from pipeline import executor_main
from tests.steps.tiny import train

step = train(num_steps=0)

if __name__ == "__main__":
    executor_main([step])
