"""An empty name."""

# expect: field `name`: a step name must be a non-empty string
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
