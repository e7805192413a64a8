"""A config that is the dataclass itself, not an instance."""

# expect: step 'x', field `config`: config must be a dataclass instance
# args:
from pipeline import Step, executor_main
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig)

if __name__ == "__main__":
    executor_main([step])
