"""A step function made at run time in a module nobody can import (e.g. from exec'd code)."""

# expect: step 'x', field `fn`: fn generated_steps:write is not importable
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig

namespace: dict = {"__name__": "generated_steps"}
exec("def write(config):\n    pass\n", namespace)
step = Step("x", namespace["write"], WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
