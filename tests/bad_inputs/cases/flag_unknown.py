"""An unknown command-line flag."""

# expect: field `argv`: bad command-line option: unrecognized arguments: --bogus
# args: --bogus 1
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
