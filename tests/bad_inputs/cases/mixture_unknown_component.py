"""A mixture weight naming a component that does not exist (a typo)."""

# expect: step 'mixture/tiny', field `weights`: phase 0 names unknown component(s) ['prsoe']
# args:
from pipeline import executor_main
from tests.steps.tiny import mix

step = mix(weights={"prsoe": 0.5, "arithmetic": 0.5})

if __name__ == "__main__":
    executor_main([step])
