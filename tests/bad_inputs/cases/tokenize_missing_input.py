"""A local input pattern that matches no file."""

# expect: step 'tokenized/prose', field `train[0]`: train input 'data/corpus/prose/tran-*.jsonl'
# args:
from pipeline import executor_main
from tests.steps.tiny import tok

step = tok("prose", train=["data/corpus/prose/tran-*.jsonl"])

if __name__ == "__main__":
    executor_main([step])
