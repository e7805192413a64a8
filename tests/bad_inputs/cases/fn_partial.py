"""A functools.partial as step function (no importable name)."""

# expect: step 'x', field `fn`: fn must be a module-level function
# args:
import functools

from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", functools.partial(write_value), WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
