"""A config holding a Step object instead of its output."""

# expect: step 'x', field `inputs.0`: holds step 'up' itself
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

up = Step("up", write_value, WriteConfig(this_output()))
step = Step("x", write_value, WriteConfig(this_output(), inputs=[up]))

if __name__ == "__main__":
    executor_main([step])
