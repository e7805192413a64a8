"""--only matching no step."""

# expect: field `only`: --only 'nothing' matches no step name
# args: --only nothing
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
