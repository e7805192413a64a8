"""A training longer than its mixture was sized for (the epochs table would be wrong)."""

# expect: step 'train/tiny', field `num_steps`: 150 steps is longer than the mixture 'mixture/tiny'
# args:
from pipeline import executor_main
from tests.steps.tiny import train

step = train(num_steps=150)

if __name__ == "__main__":
    executor_main([step])
