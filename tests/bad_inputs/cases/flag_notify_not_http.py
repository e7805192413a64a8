"""A webhook that is not an http(s) URL."""

# expect: experiment, field `--notify`: the webhook is not an http(s) URL
# args: --notify ftp://hooks.example.com/secret
from pipeline import Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()))

if __name__ == "__main__":
    executor_main([step])
