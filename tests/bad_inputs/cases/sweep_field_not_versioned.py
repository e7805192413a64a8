"""A sweep over a field that is not part of identity: its runs would differ only in name."""

# expect: step 'x', field `counter`: is not versioned
# args:
from pipeline import Step, executor_main, grid, sweep, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

template = Step("x", write_value, WriteConfig(this_output(), value=versioned(1)))

if __name__ == "__main__":
    executor_main(sweep(template, grid(counter=["a", "b"])))
