"""A name part starting with a dot (would hide among metadata files)."""

# expect: step 'data/.status', field `name`
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("data/.status", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
