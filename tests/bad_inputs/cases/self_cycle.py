"""A step reads its own output through output_of."""

# expect: the steps form a cycle
# args:
from pipeline import Step, executor_main, output_of, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("loop/self", write_value, WriteConfig(this_output(), inputs=[output_of("loop/self")]))

if __name__ == "__main__":
    executor_main([step])
