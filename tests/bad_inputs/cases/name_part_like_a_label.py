"""A name part that looks like another step's label: its directory would nest in that output."""

# expect: field `name`: name part 'up-001b450a3fbf' looks like a step label
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("up-001b450a3fbf/inner", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
