"""A name with a space."""

# expect: step 'my step', field `name`: name part 'my step'
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("my step", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
