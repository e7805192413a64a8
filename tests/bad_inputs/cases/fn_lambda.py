"""A step function that is a lambda."""

# expect: step 'x', field `fn`: fn <lambda> is a lambda
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig

step = Step("x", lambda config: None, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
