"""A name part longer than a file name can be: it used to plan fine and fail at run time."""

# expect: field `name`: name part 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... is 300 bytes
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("data/" + "x" * 300, write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
