"""Global KV heads that do not divide the query heads."""

# expect: step 'train/tiny', field `model.num_global_kv_heads`: 3 does not divide num_heads 4
# args:
import dataclasses

from pipeline import executor_main
from steps.models import TINY_MOE
from tests.steps.tiny import train

model = dataclasses.replace(
    TINY_MOE, family="drydock_moe", sliding_window=16, global_every=2, num_global_kv_heads=3
)
step = train(model=model)

if __name__ == "__main__":
    executor_main([step])
