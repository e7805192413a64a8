"""A name that is not a string."""

# expect: field `name`: a step name must be a non-empty string, got 42
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step(42, write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
