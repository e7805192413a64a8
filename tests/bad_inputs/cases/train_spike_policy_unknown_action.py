"""A spike policy whose action is not one of warn, skip, rewind."""

# expect: step 'train/tiny', field `spike_policy.action`: unknown 'restart'
# args:
from pipeline import executor_main
from steps.training.train_moe import SpikePolicy
from tests.steps.tiny import train

step = train(spike_policy=SpikePolicy(action="restart"))

if __name__ == "__main__":
    executor_main([step])
