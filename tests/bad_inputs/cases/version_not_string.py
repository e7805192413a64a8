"""A version that is not a string."""

# expect: step 'x', field `version`: version must be a string, got 3
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), version=3)

if __name__ == "__main__":
    executor_main([step])
