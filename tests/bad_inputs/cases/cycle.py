"""Two steps read each other's output."""

# expect: the steps form a cycle
# args:
from pipeline import Step, executor_main, output_of, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

a = Step("loop/a", write_value, WriteConfig(this_output(), inputs=[output_of("loop/b")]))
step = Step("loop/b", write_value, WriteConfig(this_output(), inputs=[output_of(a)]))

if __name__ == "__main__":
    executor_main([step])
