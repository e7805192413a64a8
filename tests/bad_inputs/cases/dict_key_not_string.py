"""A dict in the config with a non-string key."""

# expect: step 'x', field `inputs.0`: dict keys must be strings
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output(), inputs=[{1: "a"}]))

if __name__ == "__main__":
    executor_main([step])
