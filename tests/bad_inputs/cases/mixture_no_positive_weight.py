"""Mixture weights that do not sum to anything positive."""

# expect: step 'mixture/tiny', field `weights`: phase 0 (from step 0) has no positive weight
# args:
from pipeline import executor_main
from tests.steps.tiny import mix

step = mix(weights={"prose": 0.0, "arithmetic": 0.0})

if __name__ == "__main__":
    executor_main([step])
