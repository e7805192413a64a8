"""A negative clock-skew allowance."""

# expect: field `--clock_skew`: must be zero or more
# args: --clock_skew -5
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
