"""The skip policy with Muon, which Levanter cannot wrap in its skip-step optimizer."""

# expect: step 'train/tiny', field `spike_policy.action`: Levanter's Muon has no skip-step wrapper
# args:
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec, SpikePolicy
from tests.steps.tiny import train

step = train(OptimizerSpec(name="muon"), spike_policy=SpikePolicy(action="skip"))

if __name__ == "__main__":
    executor_main([step])
