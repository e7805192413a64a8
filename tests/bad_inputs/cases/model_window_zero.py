"""A local layers' window of zero tokens."""

# expect: step 'train/tiny', field `model.sliding_window`: must be a positive number of tokens, got 0
# args:
import dataclasses

from pipeline import executor_main
from steps.models import TINY_MOE
from tests.steps.tiny import train

step = train(model=dataclasses.replace(TINY_MOE, family="drydock_moe", sliding_window=0, global_every=2))

if __name__ == "__main__":
    executor_main([step])
