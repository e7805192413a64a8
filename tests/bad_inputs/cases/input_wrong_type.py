"""output_of given something that is neither a Step nor a name."""

# expect: step 'x', field `inputs.0`: output_of needs a Step or a step name, got int
# args:
from pipeline import Step, executor_main, output_of, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output(), inputs=[output_of(7)]))

if __name__ == "__main__":
    executor_main([step])
