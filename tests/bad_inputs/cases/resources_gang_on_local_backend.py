"""A gang of hosts run on the local backend, which runs each step as one process."""

# expect: step 'x', field `resources.hosts`: asks for 2 hosts (a gang of processes); the local backend
# args:
from pipeline import Resources, Step, executor_main, this_output
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("x", write_value, WriteConfig(this_output()), resources=Resources(hosts=2))

if __name__ == "__main__":
    executor_main([step])
