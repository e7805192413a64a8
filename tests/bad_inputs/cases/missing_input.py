"""output_of names a step that is not in the DAG."""

# expect: step 'x': field `inputs.0` points at step 'data/nowhere'
# args:
from pipeline import Step, executor_main, output_of, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output(), inputs=[output_of("data/nowhere")]))

if __name__ == "__main__":
    executor_main([step])
