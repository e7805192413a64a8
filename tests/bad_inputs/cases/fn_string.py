"""A step function given as an import string."""

# expect: step 'x', field `fn`: fn must be a module-level function
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig

step = Step("x", "tests.pipeline.stepfns:write_value", WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
