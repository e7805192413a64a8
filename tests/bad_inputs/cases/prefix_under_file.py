"""A prefix whose parent is a regular file (it can be neither read nor created)."""

# expect: prefix
# args: --prefix {tmp}/afile/prefix
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
