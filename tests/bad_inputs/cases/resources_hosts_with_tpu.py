"""A TPU slice given a host count too (its type says how many hosts it has)."""

# expect: step 'x', field `resources.hosts`: a TPU slice type says how many hosts it has (v5p-64)
# args:
from pipeline import Resources, Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), resources=Resources(tpu="v5p-64", hosts=8))

if __name__ == "__main__":
    executor_main([step])
