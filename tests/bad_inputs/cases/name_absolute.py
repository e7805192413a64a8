"""An absolute name."""

# expect: step '/etc/x', field `name`: name must be relative
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("/etc/x", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
