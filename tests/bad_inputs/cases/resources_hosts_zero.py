"""A gang of zero hosts."""

# expect: step 'x', field `resources.hosts`: must be a whole number >= 1, got 0
# args:
from pipeline import Resources, Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), resources=Resources(hosts=0))

if __name__ == "__main__":
    executor_main([step])
