"""A sweep over a field path the template's config does not have (a typo)."""

# expect: step 'train/tiny', field `optimizer.learning_rat`: OptimizerSpec has no field 'learning_rat'
# args:
from pipeline import executor_main, grid, sweep
from tests.steps.tiny import train

if __name__ == "__main__":
    executor_main(sweep(train(), grid({"optimizer.learning_rat": [1e-3, 3e-3]})))
