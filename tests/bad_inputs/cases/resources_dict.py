"""Resources given as a dict."""

# expect: step 'x', field `resources`: resources must be a Resources, got dict
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), resources={"cpus": 2})

if __name__ == "__main__":
    executor_main([step])
