"""A mixture given a training's output as a component (it writes no tokenized cache)."""

# expect: step 'mixture/tiny', field `components['prose']`: 'train/tiny' is a train_moe step
# args:
from pipeline import executor_main
from tests.steps.tiny import mix, tok, train

step = mix(components={"prose": train(), "arithmetic": tok("arithmetic")})

if __name__ == "__main__":
    executor_main([step])
