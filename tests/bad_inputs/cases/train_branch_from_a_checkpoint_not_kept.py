"""A branch from a checkpoint its trunk never writes (it keeps one every 50 steps)."""

# expect: field `init_step`: the training keeps checkpoints every 50 steps and at its final step 99; step 30
# args:
from pipeline import executor_main
from tests.steps.tiny import train

trunk = train()
step = train(init_from=trunk, init_step=30)

if __name__ == "__main__":
    executor_main([step])
