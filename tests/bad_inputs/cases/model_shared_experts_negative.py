"""A negative number of shared experts."""

# expect: step 'train/tiny', field `model.num_shared_experts`: must be 0 or more, got -1
# args:
import dataclasses

from pipeline import executor_main
from steps.models import TINY_MOE
from tests.steps.tiny import train

step = train(model=dataclasses.replace(TINY_MOE, family="drydock_moe", num_shared_experts=-1))

if __name__ == "__main__":
    executor_main([step])
