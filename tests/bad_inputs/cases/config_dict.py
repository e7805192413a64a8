"""A config that is a dict, not a dataclass."""

# expect: step 'x', field `config`: config must be a dataclass instance, got dict
# args:
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import write_value

step = Step("x", write_value, {"output": this_output()})

if __name__ == "__main__":
    executor_main([step])
