"""An input sub-path that climbs out of the upstream directory."""

# expect: step 'x', field `inputs.0`: sub-path '../../etc'
# args:
from pipeline import Step, executor_main, output_of, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

up = Step("up", write_value, WriteConfig(this_output()))
step = Step("x", write_value, WriteConfig(this_output(), inputs=[output_of(up, "../../etc")]))

if __name__ == "__main__":
    executor_main([step])
