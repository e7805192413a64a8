"""executor_main with an empty list."""

# expect: field `steps`: no steps given
# args:
from pipeline import executor_main

step = None

if __name__ == "__main__":
    executor_main([])
