"""A watchdog bound of zero seconds."""

# expect: step 'x', field `resources.hang_timeout`: must be a number of seconds > 0, got 0
# args:
from pipeline import Resources, Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), resources=Resources(hang_timeout=0))

if __name__ == "__main__":
    executor_main([step])
