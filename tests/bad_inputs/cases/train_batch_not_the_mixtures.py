"""A training whose batch is not the one its mixture was sized with."""

# expect: step 'train/tiny', field `batch_size`: 16 does not match the 8 that mixture 'mixture/tiny'
# args:
from pipeline import executor_main
from tests.steps.tiny import train

step = train(batch_size=16)

if __name__ == "__main__":
    executor_main([step])
