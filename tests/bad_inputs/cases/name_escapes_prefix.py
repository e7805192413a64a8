"""A name that climbs out of the prefix."""

# expect: step '../x', field `name`: name part '..'
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("../x", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
