"""A MinHash kind the dedupe step does not have."""

# expect: step 'dedupe/web', field `minhash`: minhash must be one of one_permutation, datasketch, got 'rensa'
# args:
from pipeline import executor_main
from steps.data.dedupe import dedupe_step

step = dedupe_step("dedupe/web", inputs=["web/*.jsonl"], minhash="rensa")

if __name__ == "__main__":
    executor_main([step])
