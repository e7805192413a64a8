"""A rewind policy with a retention that keeps a single checkpoint: nowhere to go back to."""

# expect: field `keep_checkpoints`: keeps 1 checkpoint, but spike_policy rewind needs at least 2
# args:
from pipeline import executor_main
from steps.training.spikes import SpikePolicy
from tests.steps.tiny import train

step = train(spike_policy=SpikePolicy(action="rewind"), keep_checkpoints=1)

if __name__ == "__main__":
    executor_main([step])
