"""A heartbeat slower than the lease timeout."""

# expect: field `--heartbeat_interval`: heartbeat interval 5.0s must be shorter than the lease timeout 3.0s
# args: --lease_timeout 3 --heartbeat_interval 5
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("ok/step", write_value, WriteConfig(this_output(), versioned(1)))

if __name__ == "__main__":
    executor_main([step])
