"""A versioned arbitrary object."""

# expect: step 'x', field `value`
# args:
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output(), value=versioned(object())))

if __name__ == "__main__":
    executor_main([step])
