"""this_output with an absolute sub-path."""

# expect: step 'x', field `output`: sub-path '/tmp/elsewhere'
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output("/tmp/elsewhere")))

if __name__ == "__main__":
    executor_main([step])
