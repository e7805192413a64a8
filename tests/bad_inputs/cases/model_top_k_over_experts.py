"""More experts per token than experts."""

# expect: step 'train/tiny', field `model.num_experts_per_token`: 6 must be in 1..4
# args:
import dataclasses

from pipeline import executor_main
from steps.models import TINY_MOE
from tests.steps.tiny import train

step = train(model=dataclasses.replace(TINY_MOE, family="drydock_moe", num_experts_per_token=6))

if __name__ == "__main__":
    executor_main([step])
