"""A local tokenizer directory that does not exist (a typo)."""

# expect: step 'tokenized/prose', field `tokenizer`: no tokenizer directory
# args:
from pipeline import executor_main
from tests.steps.tiny import tok

step = tok("prose", tokenizer="data/tokenizr")

if __name__ == "__main__":
    executor_main([step])
