"""--max_concurrent below 1."""

# expect: field `--max_concurrent`: must be at least 1
# args: --max_concurrent 0
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
