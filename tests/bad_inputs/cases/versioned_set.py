"""A versioned value that has no canonical JSON form."""

# expect: step 'x', field `value`
# args:
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output(), value=versioned({1, 2})))

if __name__ == "__main__":
    executor_main([step])
