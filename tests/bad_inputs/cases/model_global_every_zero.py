"""A global layer every 0 layers."""

# expect: step 'train/tiny', field `model.global_every`: must be 1 or more, got 0
# args:
import dataclasses

from pipeline import executor_main
from steps.models import TINY_MOE
from tests.steps.tiny import train

step = train(model=dataclasses.replace(TINY_MOE, family="drydock_moe", sliding_window=16, global_every=0))

if __name__ == "__main__":
    executor_main([step])
