"""A missing config."""

# expect: step 'x', field `config`: config must be a dataclass instance, got NoneType
# args:
from pipeline import Step, executor_main
from tests.pipeline.stepfns import write_value

step = Step("x", write_value, None)

if __name__ == "__main__":
    executor_main([step])
