"""A step function defined inside another function."""

# expect: step 'x', field `fn`: fn make.<locals>.inner is a lambda or a nested function
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig


def make():
    def inner(config):
        return None

    return inner


step = Step("x", make(), WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
