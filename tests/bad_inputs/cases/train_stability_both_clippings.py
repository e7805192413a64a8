"""Update RMS clipping and update-norm clipping at once, which Levanter refuses."""

# expect: field `stability.clip_update_sigma`: Levanter cannot clip by RMS and by norm history
# args:
from pipeline import executor_main
from steps.training.train_moe import Stability
from tests.steps.tiny import train

step = train(stability=Stability(update_rms_clipping=1.0, clip_update_sigma=3.0))

if __name__ == "__main__":
    executor_main([step])
