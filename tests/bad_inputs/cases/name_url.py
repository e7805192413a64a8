"""A URL as a name."""

# expect: step 's3://bucket/x', field `name`: name must be relative
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("s3://bucket/x", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
