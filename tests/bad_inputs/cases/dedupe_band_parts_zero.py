"""LSH bands split into zero parts."""

# expect: step 'dedupe/web', field `band_parts`: band_parts must be a positive integer, got 0
# args:
from pipeline import executor_main
from steps.data.dedupe import dedupe_step

step = dedupe_step("dedupe/web", inputs=["web/*.jsonl"], band_parts=0)

if __name__ == "__main__":
    executor_main([step])
