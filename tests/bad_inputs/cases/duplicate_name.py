"""Two different steps share one name."""

# expect: two different steps are named 'data/a'
# args:
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

one = Step("data/a", write_value, WriteConfig(this_output(), versioned(1)))
two = Step("data/a", write_value, WriteConfig(this_output(), versioned(2)))

if __name__ == "__main__":
    executor_main([one, two])
