"""Warmup-stable-decay whose warm-up and decay together are longer than the run."""

# expect: field `optimizer.decay`: warm-up (0.5) and decay (0.6) together are longer than the run (100 steps)
# args:
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import train

step = train(OptimizerSpec(warmup=0.5, decay=0.6))

if __name__ == "__main__":
    executor_main([step])
