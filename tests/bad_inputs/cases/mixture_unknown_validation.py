"""A validation set that is not one of the components."""

# expect: step 'mixture/tiny', field `validation`: unknown component(s) ['code']
# args:
from pipeline import executor_main
from tests.steps.tiny import mix

step = mix(validation=["code"])

if __name__ == "__main__":
    executor_main([step])
