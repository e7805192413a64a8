"""executor_main given something that is not a Step."""

# expect: field `steps`: expected a Step, got str
# args:
from pipeline import executor_main

step = "data/a"

if __name__ == "__main__":
    executor_main([step])
